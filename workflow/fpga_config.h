// The FPGA settings as machine files, pipelines and task files write them (docs/fpga.md):
//   "fpga": "cpu" | "opencl" | "auto"            (a backend; "simulated", the older value, is "auto")
//   "fpga": {"backend": ..., "platform": "...", "binary": "FILE.aocx" | "source": "FILE.cl",
//            "target": {"name": "...", "clock_mhz": 480, "lanes": 16, "memory_gbs": 76.8}}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kernels/fpga/device.h"

namespace msaflow::workflow {

// Throws kInvalidInput "<where>/<field>: <problem>". A relative binary path resolves against
// `base_dir`.
kernels::fpga::Config FpgaConfigFromJson(const nlohmann::json& v, const std::string& where, const std::string& base_dir);
nlohmann::json FpgaConfigToJson(const kernels::fpga::Config& c);

}  // namespace msaflow::workflow
