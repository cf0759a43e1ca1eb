#include "nam/verify.h"

#include <set>

#include "common/error.h"
#include "nam/fabric_store.h"
#include "nam/fault_store.h"
#include "nam/file_store.h"

namespace msaflow::nam {
namespace {

Store& Unwrapped(Store& s) {
  if (auto* f = dynamic_cast<FaultStore*>(&s)) return Unwrapped(f->inner());
  return s;
}

}  // namespace

VerifyReport Verify(Store& given, bool repair) {
  Store& store = Unwrapped(given);
  VerifyReport r;
  std::set<std::string> seen;
  std::string buf;
  auto check = [&](const std::string& name, const std::string& listed_damage) {
    if (!seen.insert(name).second) return;
    ++r.objects;
    std::string why = listed_damage;
    if (why.empty()) {
      try {
        r.bytes += store.GetInto(name, buf).size;
        return;
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kNotFound) {  // removed while we looked
          --r.objects;
          return;
        }
        if (e.kind() != ErrorKind::kCorrupt) throw;
        why = e.what();
      }
    }
    r.damaged.push_back({name, why, ""});
  };
  for (const auto& info : store.List("")) check(info.name, info.meta.value("damaged", std::string()));
  auto* fabric = dynamic_cast<FabricStore*>(&store);
  if (fabric) {
    // A server lists only what it could read at start; it names the damaged ones apart.
    nlohmann::json cap = fabric->Capacity();
    for (const auto& n : cap.value("damaged_names", nlohmann::json::array()))
      if (n.is_string()) check(n.get<std::string>(), "");
    const auto total = cap.value("damaged", int64_t{0});
    if (total > static_cast<int64_t>(cap.value("damaged_names", nlohmann::json::array()).size()) && !repair)
      r.damaged.push_back({"…", "the server holds " + std::to_string(total) + " damaged objects; the first 64 are named "
                                "(verify --repair, then verify again, for the rest)", ""});
  }
  if (!repair) return r;
  for (auto& d : r.damaged) {
    if (d.name == "…") continue;
    if (auto* file = dynamic_cast<FileStore*>(&store)) {
      d.moved_to = file->MoveAside(d.name);
    } else if (fabric) {
      if (fabric->Remove(d.name)) d.moved_to = "moved aside by the server (DAMAGED/ in its persist directory)";
    } else if (store.Remove(d.name)) {
      d.moved_to = "removed (a memory store keeps no files)";
    }
  }
  return r;
}

}  // namespace msaflow::nam
