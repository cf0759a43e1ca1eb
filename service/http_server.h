// `msaflow serve`: the runs as a multi-user HTTP/1.1 API with JSON bodies (cpp-httplib), a
// Server-Sent Events stream of every journal record, and a web dashboard at /, over the
// service's Registry (service/registry.h). docs/service.md is the user's guide; the API is
// service/openapi.json, served at /v1/openapi.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"

namespace msaflow::service {

struct ServeOptions {
  std::string listen = "127.0.0.1:8080";  // HOST:PORT; port 0 picks a free one
  std::string runs_dir = "runs";
  std::string users_file;
  std::string machine;        // "" = each pipeline's own
  int64_t max_running = 2;
  std::string tls_cert, tls_key;
  bool insecure = false;      // allow plain HTTP on an address other than loopback
  std::string msaflow_exe;
  std::string ready_file;     // {url, pid} written once serving; removed on exit
  size_t workers = 160;       // threads serving connections (an event stream holds one)
  size_t max_waiting = 256;   // connections waiting for a worker; beyond, 503 at once
  size_t max_streams = 128;   // event streams open at once; beyond, 503
  size_t max_body = 1 << 20;  // request body bytes; beyond, 413
  int read_timeout_s = 10;    // a request's headers must all come within this (and each read)
  int request_timeout_s = 120;  // ... and its body within this after them (64 MiB at 0.5 MiB/s)
  // Inference (/v2, service/inference_api.h): models every user may name, NAME -> a run
  // directory or an exported .onnx; the batching of each model; the body of an infer request.
  std::map<std::string, std::string> models;
  int64_t max_batch = 64;
  double max_delay_ms = 2;
  int64_t max_queue = 1024;
  size_t max_infer_body = size_t{64} << 20;
  // Time for the requests' deadlines and the event streams' polls and keep-alives; null: the
  // real clock (a test may give a ManualClock).
  Clock* clock = nullptr;
};

// Serves until SIGTERM or SIGINT; returns the exit code. Throws Error on a bad option (a
// non-loopback address without TLS, an unreadable users file) before it listens.
int Serve(const ServeOptions& o);

// The routes: method and OpenAPI path ("/v1/runs/{id}"), as served. A test holds them against
// service/openapi.json.
struct Route {
  std::string method, path;
};
std::vector<Route> Routes();
// The OpenAPI document and the dashboard's files, as built into the binary.
const char* OpenApiDocument();

}  // namespace msaflow::service
