// The NAM wire protocol, version 1. docs/nam-protocol.md is the specification; every constant
// of the protocol lives here and nowhere else.
//
// A message is one libfabric message (fi_send/fi_recv on an FI_EP_RDM endpoint):
//
//   Header (kHeaderSize bytes, little-endian) | reply address (requests only) | JSON | payload
//
// Object bytes move by RMA (fi_write into a region the server allocated, fi_read from it) or,
// for a client on the server's node, by copying through the server's memory pool mapped into
// the client. Objects up to kInlineMax bytes travel inside the messages instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace msaflow::nam::wire {

inline constexpr uint32_t kMagic = 0x4E41534D;  // "MSAN" read as little-endian bytes
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderSize = 32;
inline constexpr size_t kMaxAddr = 128;          // a reply address (fi_getname) is at most this
inline constexpr size_t kMaxJson = size_t{32} * 1024;    // the JSON part of any message
inline constexpr size_t kInlineMax = size_t{32} * 1024;  // objects this small travel inside messages
inline constexpr size_t kMaxMessage = kHeaderSize + kMaxAddr + kMaxJson + kInlineMax;
inline constexpr size_t kMaxMeta = size_t{16} * 1024;    // an object's metadata, as compact JSON
inline constexpr size_t kListPageBytes = size_t{24} * 1024;  // a LIST reply holds at most this much JSON
inline constexpr size_t kRmaChunk = 1 << 20;     // RMA transfers move in chunks of this size
inline constexpr int kRmaWindow = 16;            // ... with at most this many in flight
inline constexpr uint16_t kReplyBit = 0x8000;

enum class Op : uint16_t {
  kHello = 1,     // {token, pid, host, boot_id} -> {session, server_pid, boot_id, map?, capacity}
  kAlloc = 2,     // {name, size, meta, via} -> {alloc, addr, key, offset}
  kCommit = 3,    // {alloc, checksum} -> {info}
  kAbort = 4,     // {alloc} -> {}
  kLookup = 5,    // {name, via} -> {info, read?, addr?, key?, offset?} (+ payload if inline)
  kRelease = 6,   // {read} -> {}
  kStat = 7,      // {name} -> {info} or not found
  kList = 8,      // {prefix, after} -> {objects, more}
  kRemove = 9,    // {name} -> {removed}
  kCapacity = 10, // {} -> {capacity, used, objects, resident, pinned, sessions}
  kBye = 11,      // {} -> {}
  kPutInline = 12,  // {name, meta, checksum} + payload -> {info}
};

// Reply status; docs/nam-protocol.md lists what each means to a client.
enum class Status : uint32_t {
  kOk = 0,
  kInvalid = 1,       // a field is missing, of the wrong type or out of range
  kNotFound = 2,
  kCorrupt = 3,       // checksum mismatch (commit, reload from disk)
  kFull = 4,          // the pool cannot hold the object
  kUnauthorized = 5,  // missing or wrong token
  kProtocol = 6,      // malformed message; the server forgets the session
  kStaleSession = 7,  // unknown or expired session: say hello again
  kInternal = 8,
};

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t op = 0;        // Op, | kReplyBit in replies
  uint64_t session = 0;   // 0 in HELLO
  uint64_t request = 0;   // echoed in the reply
  uint16_t addr_len = 0;  // bytes of reply address after the header (requests)
  uint16_t status = 0;    // Status (replies)
  uint32_t json_len = 0;  // bytes of JSON after the address; the payload is the rest
};

// The 32 header bytes: magic u32 | version u16 | op u16 | session u64 | request u64 |
// addr_len u16 | status u16 | json_len u32. The payload length is what remains of the message.
inline void PutU16(char* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void PutU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline uint16_t GetU16(const char* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t GetU32(const char* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint64_t GetU64(const char* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

inline void EncodeHeader(const Header& h, char* out) {
  PutU32(out, h.magic);
  PutU16(out + 4, h.version);
  PutU16(out + 6, h.op);
  PutU64(out + 8, h.session);
  PutU64(out + 16, h.request);
  PutU16(out + 24, h.addr_len);
  PutU16(out + 26, h.status);
  PutU32(out + 28, h.json_len);
}

inline Header DecodeHeader(const char* in) {
  Header h;
  h.magic = GetU32(in);
  h.version = GetU16(in + 4);
  h.op = GetU16(in + 6);
  h.session = GetU64(in + 8);
  h.request = GetU64(in + 16);
  h.addr_len = GetU16(in + 24);
  h.status = GetU16(in + 26);
  h.json_len = GetU32(in + 28);
  return h;
}

// A parsed message: views into the receive buffer.
struct Message {
  Header header;
  std::string_view addr;
  std::string_view json;
  std::string_view payload;
};

// Splits a received message; returns an empty string or what is wrong with it.
inline std::string Parse(const char* buf, size_t len, Message* m) {
  if (len < kHeaderSize) return "message of " + std::to_string(len) + " bytes is shorter than the header";
  m->header = DecodeHeader(buf);
  const Header& h = m->header;
  if (h.magic != kMagic) return "bad magic (not an msaflow NAM message)";
  if (h.version != kVersion)
    return "protocol version " + std::to_string(h.version) + " (this side speaks " + std::to_string(kVersion) + ")";
  if (h.addr_len > kMaxAddr) return "reply address of " + std::to_string(h.addr_len) + " bytes";
  if (h.json_len > kMaxJson) return "JSON part of " + std::to_string(h.json_len) + " bytes (at most 32768)";
  size_t need = kHeaderSize + h.addr_len + h.json_len;
  if (need > len) return "header announces " + std::to_string(need) + " bytes, message has " + std::to_string(len);
  m->addr = std::string_view(buf + kHeaderSize, h.addr_len);
  m->json = std::string_view(buf + kHeaderSize + h.addr_len, h.json_len);
  m->payload = std::string_view(buf + need, len - need);
  if (m->payload.size() > kInlineMax) return "inline payload of " + std::to_string(m->payload.size()) + " bytes";
  return "";
}

// Lays out a message into `out` (at least kMaxMessage bytes); returns its length.
inline size_t Build(const Header& h, std::string_view addr, std::string_view json, std::string_view payload, char* out) {
  Header hh = h;
  hh.addr_len = static_cast<uint16_t>(addr.size());
  hh.json_len = static_cast<uint32_t>(json.size());
  EncodeHeader(hh, out);
  size_t off = kHeaderSize;
  if (!addr.empty()) std::memcpy(out + off, addr.data(), addr.size());  // an empty view's data() may be null
  off += addr.size();
  if (!json.empty()) std::memcpy(out + off, json.data(), json.size());
  off += json.size();
  if (!payload.empty()) std::memcpy(out + off, payload.data(), payload.size());
  return off + payload.size();
}

}  // namespace msaflow::nam::wire
