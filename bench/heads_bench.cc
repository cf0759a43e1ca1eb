// bench/heads: head training on real features, the msaflow side of bench/versus.py (which
// runs scikit-learn on the same files and prints the ratios). Each line of output is one JSON
// object:
//   {"what": "adam", "batch": B, "lr": r, "epochs": E, "seconds": s, "test_accuracy": a}
//                                                                    one softmax head, Adam
//   {"what": "lbfgs", "iterations": I, ...}                          one softmax head, L-BFGS
//   {"what": "together", "heads": K, "seconds": s, "alone_seconds": s1, "max_weight_difference": d,
//    "accuracies": [...]}                                           a round's heads, batched vs alone
// Times are medians over --reps and include standardising the features (InitHead), as
// scikit-learn's side includes its StandardScaler.
//
//   bench_heads --data DIR [--reps 3] [--epochs 1,2,3,5,8,12,20] [--iterations 25,50,100]
//               [--adam 64:0.001,256:0.004,256:0.016,512:0.016,1024:0.01] [--what adam,lbfgs,together]
//
// Adam runs at batch 64 / lr 1e-3 (the pipelines' default) and at larger batches with larger
// learning rates (fewer, bigger GEMMs per epoch). The grid is fixed here, as scikit-learn's
// iteration caps are in versus.py; versus.py takes each side's fastest setting that reaches
// the accuracy. On Fashion-MNIST's MobileNetV2 features, batch 256 at lr 0.016 reaches in 3
// epochs what lr 0.004 reaches in 5 (0.8895 and 0.880 test accuracy).
//
// DIR holds meta.json {"train": n, "test": m, "dim": d, "classes": c} and train_x.f32,
// train_y.u8, test_x.f32, test_y.u8 (raw little-endian float32 rows and uint8 labels).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/error.h"
#include "common/files.h"
#include "kernels/head.h"
#include "kernels/metrics.h"
#include "parallel/comm.h"
#include "parallel/train.h"

namespace {

using namespace msaflow;
using Steady = std::chrono::steady_clock;

struct Split {
  int64_t n = 0;
  std::vector<float> x;
  std::vector<uint8_t> y;
};

template <typename T>
std::vector<T> ReadRaw(const std::string& path, size_t count) {
  const std::string bytes = ReadFile(path);
  if (bytes.size() != count * sizeof(T))
    Throw(ErrorKind::kInvalidInput, path + ": " + std::to_string(bytes.size()) + " bytes, expected " +
                                        std::to_string(count * sizeof(T)));
  std::vector<T> v(count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::vector<int64_t> Ints(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}

struct Trained {
  std::vector<kernels::Head> heads;
  double seconds = 0;
};

// Trains the heads (fresh from cfgs) together or each alone, timing InitHead + standardising
// + training.
Trained TrainHeads(const std::vector<kernels::HeadConfig>& cfgs, const Split& tr, int64_t dim, int64_t classes,
                   bool together) {
  Trained t;
  parallel::SelfComm self;
  const auto t0 = Steady::now();
  for (const auto& cfg : cfgs) t.heads.push_back(kernels::InitHead(cfg, tr.x.data(), tr.y.data(), tr.n, dim, classes));
  // As the train step does it: raw rows, standardised as the batches are gathered.
  const parallel::TrainData data{tr.x.data(), tr.y.data(), tr.n, t.heads[0].mean.data(), t.heads[0].inv_std.data()};
  if (together) {
    std::vector<kernels::Head*> members;
    for (auto& h : t.heads) members.push_back(&h);
    parallel::TrainSyncTogether(self, data, members);
  } else {
    for (auto& h : t.heads) parallel::TrainSync(self, data, &h);
  }
  t.seconds = std::chrono::duration<double>(Steady::now() - t0).count();
  return t;
}

double TestAccuracy(const kernels::Head& h, const Split& te) {
  auto logits = h.Logits(te.x.data(), te.n);
  return kernels::Evaluate(logits.data(), te.y.data(), te.n, h.classes).accuracy();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"head training on real features (bench/versus.py runs it)"};
  std::string dir, epochs_list = "1,2,3,5,8,12,20", iters_list = "25,50,100";
  std::string what = "adam,lbfgs,together", adam_list = "64:0.001,256:0.004,256:0.016,512:0.016,1024:0.01";
  int reps = 3;
  app.add_option("--data", dir, "directory of meta.json and the raw features")->required();
  app.add_option("--reps", reps, "repetitions (median)");
  app.add_option("--epochs", epochs_list, "Adam epoch counts to try");
  app.add_option("--iterations", iters_list, "L-BFGS iteration caps to try");
  app.add_option("--adam", adam_list, "Adam batch:learning-rate pairs to try");
  app.add_option("--what", what, "which measurements, of adam,lbfgs,together (for profiling one)");
  CLI11_PARSE(app, argc, argv);
  return bench::ReportErrors("bench_heads", [&] {
    const auto meta = nlohmann::json::parse(ReadFile(dir + "/meta.json"));
    const int64_t dim = meta.at("dim"), classes = meta.at("classes");
    Split tr, te;
    tr.n = meta.at("train");
    te.n = meta.at("test");
    tr.x = ReadRaw<float>(dir + "/train_x.f32", static_cast<size_t>(tr.n * dim));
    tr.y = ReadRaw<uint8_t>(dir + "/train_y.u8", static_cast<size_t>(tr.n));
    te.x = ReadRaw<float>(dir + "/test_x.f32", static_cast<size_t>(te.n * dim));
    te.y = ReadRaw<uint8_t>(dir + "/test_y.u8", static_cast<size_t>(te.n));
    auto median_run = [&](const std::vector<kernels::HeadConfig>& cfgs, bool together) {
      std::vector<double> secs;
      Trained last;
      for (int r = 0; r < reps; ++r) {
        last = TrainHeads(cfgs, tr, dim, classes, together);
        secs.push_back(last.seconds);
      }
      last.seconds = bench::Median(secs);
      return last;
    };
    kernels::HeadConfig soft;
    soft.lr = 1e-3;
    soft.l2 = 1e-4;
    soft.batch = 64;
    soft.seed = 1;
    soft.data_seed = 1;
    auto wanted = [&](const std::string& part) { return ("," + what + ",").find("," + part + ",") != std::string::npos; };
    if (wanted("adam")) {
      std::vector<std::pair<int64_t, double>> adam;
      std::stringstream ss(adam_list);
      for (std::string item; std::getline(ss, item, ',');) {
        const size_t colon = item.find(':');
        if (colon == std::string::npos) Throw(ErrorKind::kInvalidInput, "--adam '" + item + "': expected batch:lr");
        adam.emplace_back(std::stoll(item.substr(0, colon)), std::stod(item.substr(colon + 1)));
      }
      for (const auto& [batch, lr] : adam)
        for (int64_t e : Ints(epochs_list)) {
          kernels::HeadConfig cfg = soft;
          cfg.epochs = e;
          cfg.batch = batch;
          cfg.lr = lr;
          Trained t = median_run({cfg}, false);
          bench::PrintJsonLine({{"what", "adam"}, {"batch", batch}, {"lr", lr}, {"epochs", e},
                                              {"seconds", t.seconds}, {"test_accuracy", TestAccuracy(t.heads[0], te)}});
        }
    }
    if (wanted("lbfgs")) {
      for (int64_t it : Ints(iters_list)) {
        kernels::HeadConfig cfg = soft;
        cfg.optimizer = "lbfgs";
        cfg.epochs = it;
        Trained t = median_run({cfg}, false);
        bench::PrintJsonLine({{"what", "lbfgs"}, {"iterations", it}, {"seconds", t.seconds},
                                            {"test_accuracy", TestAccuracy(t.heads[0], te)}});
      }
    }
    if (!wanted("together")) return;
    // A round's heads (the quickstart's grid: softmax and MLP-128, two learning rates, two l2).
    std::vector<kernels::HeadConfig> round;
    for (const char* type : {"softmax", "mlp"})
      for (double lr : {1e-3, 3e-3})
        for (double l2 : {1e-4, 1e-3}) {
          kernels::HeadConfig cfg = soft;
          cfg.type = type;
          cfg.hidden = cfg.type == "mlp" ? 128 : 0;
          cfg.lr = lr;
          cfg.l2 = l2;
          cfg.epochs = 15;
          cfg.seed = round.size() + 1;
          round.push_back(cfg);
        }
    Trained both = median_run(round, true), alone = median_run(round, false);
    double worst = 0;
    nlohmann::json acc = nlohmann::json::array();
    for (size_t k = 0; k < round.size(); ++k) {
      for (size_t i = 0; i < both.heads[k].params.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(both.heads[k].params[i] - alone.heads[k].params[i])));
      acc.push_back(TestAccuracy(both.heads[k], te));
    }
    bench::PrintJsonLine({{"what", "together"}, {"heads", round.size()}, {"seconds", both.seconds},
                                        {"alone_seconds", alone.seconds}, {"max_weight_difference", worst},
                                        {"accuracies", acc}});
  });
}
