// The "opencl" backend: prepare.cl and select.cl (embedded in the binary at build time, or a
// program built offline for an FPGA board) on the first device of the chosen platform. Buffers
// grow and are reused; the resize taps and constants are uploaded only when they change.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/error.h"
#include "common/files.h"
#include "fpga_kernels.h"
#include "kernels/fpga/device.h"

namespace msaflow::kernels::fpga {
namespace {

constexpr cl_int kPlatformNotFound = -1001;  // CL_PLATFORM_NOT_FOUND_KHR: the ICD loader found no platform

const char* ClName(cl_int e) {
  switch (e) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_BINARY: return "CL_INVALID_BINARY";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case kPlatformNotFound: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "an OpenCL error";
  }
}

void Check(cl_int e, const std::string& what) {
  if (e != CL_SUCCESS) Throw(ErrorKind::kIo, fmt::format("opencl: {} failed: {} ({})", what, ClName(e), e));
}

template <typename Get>
std::string InfoString(Get get) {
  size_t n = 0;
  if (get(0, nullptr, &n) != CL_SUCCESS || n == 0) return "";
  std::string s(n, '\0');
  if (get(n, s.data(), nullptr) != CL_SUCCESS) return "";
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::string PlatformString(cl_platform_id p, cl_platform_info what) {
  return InfoString([&](size_t n, void* v, size_t* r) { return clGetPlatformInfo(p, what, n, v, r); });
}
std::string DeviceString(cl_device_id d, cl_device_info what) {
  return InfoString([&](size_t n, void* v, size_t* r) { return clGetDeviceInfo(d, what, n, v, r); });
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Chosen {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  std::string platform_name, device_name;
};

// The first platform matching `want` (name or vendor, any case) that has a device; an
// accelerator (an FPGA board) before any other device type.
Chosen Choose(const std::string& want) {
  cl_uint n = 0;
  cl_int e = clGetPlatformIDs(0, nullptr, &n);
  if (e == kPlatformNotFound || (e == CL_SUCCESS && n == 0))
    Throw(ErrorKind::kUnsupported,
          "opencl: no OpenCL platform is installed (the ICD loader found none; on Debian install pocl-opencl-icd for "
          "the simulated FPGA, or the board vendor's runtime); use fpga \"cpu\" or \"auto\" to run without one");
  Check(e, "clGetPlatformIDs");
  std::vector<cl_platform_id> ps(n);
  Check(clGetPlatformIDs(n, ps.data(), nullptr), "clGetPlatformIDs");
  std::vector<std::string> seen;
  for (cl_platform_id p : ps) {
    std::string name = PlatformString(p, CL_PLATFORM_NAME), vendor = PlatformString(p, CL_PLATFORM_VENDOR);
    seen.push_back("'" + name + "' (" + vendor + ")");
    if (!want.empty() && Lower(name).find(Lower(want)) == std::string::npos &&
        Lower(vendor).find(Lower(want)) == std::string::npos)
      continue;
    for (cl_device_type type : {cl_device_type{CL_DEVICE_TYPE_ACCELERATOR}, cl_device_type{CL_DEVICE_TYPE_ALL}}) {
      cl_device_id d = nullptr;
      cl_uint nd = 0;
      if (clGetDeviceIDs(p, type, 1, &d, &nd) == CL_SUCCESS && nd > 0)
        return {p, d, name, DeviceString(d, CL_DEVICE_NAME)};
    }
    seen.back() += " with no device";
  }
  std::string list;
  for (const auto& s : seen) list += (list.empty() ? "" : ", ") + s;
  Throw(ErrorKind::kUnsupported,
        want.empty() ? "opencl: no OpenCL platform has a device (found " + list + ")"
                     : "opencl: no OpenCL platform named like '" + want + "' with a device (found " + list +
                           "); set the machine file's fpga.platform to one of them");
}

struct Buffer {
  cl_mem mem = nullptr;
  size_t bytes = 0;
};

class OpenClDevice final : public Device {
 public:
  explicit OpenClDevice(const Config& config) {
    try {
      Init(config);
    } catch (...) {
      Release();
      throw;
    }
  }
  ~OpenClDevice() override { Release(); }
  OpenClDevice(const OpenClDevice&) = delete;
  OpenClDevice& operator=(const OpenClDevice&) = delete;

  std::string Name() const override { return name_; }
  std::string Backend() const override { return "opencl"; }

  void Prepare(const ImageBatch& in, const InputSpec& spec, float* out) override {
    RunPrepare(prepare_, in, spec, out, sizeof(float));
  }
  void PrepareInt8(const ImageBatch& in, const InputSpec& spec, int8_t* out) override {
    RunPrepare(prepare_int8_, in, spec, out, sizeof(int8_t));
  }

  std::vector<uint32_t> Order(const std::vector<uint64_t>& keys) override {
    std::vector<uint32_t> order(keys.size());
    if (keys.empty()) return order;
    const cl_uint n = static_cast<cl_uint>(keys.size());
    Upload(keys_, keys.data(), keys.size() * sizeof(uint64_t), CL_MEM_READ_ONLY);
    Ensure(order_buf_, order.size() * sizeof(uint32_t), CL_MEM_WRITE_ONLY);
    Arg(order_, 0, keys_.mem);
    Check(clSetKernelArg(order_, 1, sizeof n, &n), "clSetKernelArg(order_by_key, 1)");
    Arg(order_, 2, order_buf_.mem);
    size_t global = n;
    Check(clEnqueueNDRangeKernel(queue_, order_, 1, nullptr, &global, nullptr, 0, nullptr, nullptr),
          "running order_by_key on " + name_);
    Check(clEnqueueReadBuffer(queue_, order_buf_.mem, CL_TRUE, 0, order.size() * sizeof(uint32_t), order.data(), 0,
                              nullptr, nullptr),
          "reading the order from " + name_);
    return order;
  }

 private:
  void Init(const Config& config) {
    Chosen ch = Choose(config.platform);
    device_ = ch.device;
    name_ = "opencl: " + ch.platform_name + " / " + ch.device_name;
    cl_int e = CL_SUCCESS;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(ch.platform), 0};
    context_ = clCreateContext(props, 1, &device_, nullptr, nullptr, &e);
    Check(e, "clCreateContext on " + name_);
    queue_ = clCreateCommandQueue(context_, device_, 0, &e);
    Check(e, "clCreateCommandQueue on " + name_);
    Build(config);
    prepare_ = MakeKernel("prepare");
    prepare_int8_ = MakeKernel("prepare_int8");
    order_ = MakeKernel("order_by_key");
  }

  void Release() {
    for (Buffer* b : {&px_, &out_, &ty0_, &ty1_, &twy_, &tx0_, &tx1_, &twx_, &consts_, &keys_, &order_buf_})
      if (b->mem) clReleaseMemObject(b->mem);
    for (cl_kernel k : {prepare_, prepare_int8_, order_})
      if (k) clReleaseKernel(k);
    if (program_) clReleaseProgram(program_);
    if (queue_) clReleaseCommandQueue(queue_);
    if (context_) clReleaseContext(context_);
  }

  void Build(const Config& config) {
    const std::string& binary = config.binary;
    cl_int e = CL_SUCCESS;
    std::string what;
    if (!config.source.empty()) {
      std::string text = ReadFile(config.source);
      const char* src = text.c_str();
      program_ = clCreateProgramWithSource(context_, 1, &src, nullptr, &e);
      what = "the kernels in " + config.source;
    } else if (binary.empty()) {
      const char* srcs[] = {kPrepareCl, kSelectCl};
      program_ = clCreateProgramWithSource(context_, 2, srcs, nullptr, &e);
      what = "the kernels (prepare.cl, select.cl)";
    } else {
      std::string bytes = ReadFile(binary);
      const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
      size_t n = bytes.size();
      cl_int status = CL_SUCCESS;
      program_ = clCreateProgramWithBinary(context_, 1, &device_, &n, &p, &status, &e);
      if (e == CL_SUCCESS && status != CL_SUCCESS) e = status;
      if (e == CL_INVALID_BINARY)
        Throw(ErrorKind::kInvalidInput, "opencl: " + binary + ": not a program binary for " + name_ +
                                            " (built for another board or device?)");
      what = "the program binary " + binary;
    }
    Check(e, "loading " + what);
    e = clBuildProgram(program_, 1, &device_, "-cl-std=CL1.2", nullptr, nullptr);
    if (e != CL_SUCCESS) {
      std::string log = InfoString([&](size_t n, void* v, size_t* r) {
        return clGetProgramBuildInfo(program_, device_, CL_PROGRAM_BUILD_LOG, n, v, r);
      });
      while (!log.empty() && (log.back() == '\n' || log.back() == ' ')) log.pop_back();
      if (log.size() > 4000) log = log.substr(0, 4000) + "\n… (" + std::to_string(log.size()) + " characters of log)";
      Throw(ErrorKind::kUnsupported, fmt::format("opencl: {} do not build for {}: {} ({}); build log:\n{}", what, name_,
                                                 ClName(e), e, log.empty() ? "(empty)" : log));
    }
  }

  cl_kernel MakeKernel(const char* name) {
    cl_int e = CL_SUCCESS;
    cl_kernel k = clCreateKernel(program_, name, &e);
    Check(e, std::string("clCreateKernel(") + name + ") on " + name_);
    return k;
  }

  void Ensure(Buffer& b, size_t bytes, cl_mem_flags flags) {
    bytes = std::max<size_t>(bytes, 1);
    if (b.mem && b.bytes >= bytes) return;
    if (b.mem) clReleaseMemObject(b.mem);
    b = {};
    cl_int e = CL_SUCCESS;
    b.mem = clCreateBuffer(context_, flags, bytes, nullptr, &e);
    Check(e, fmt::format("allocating {} bytes on {}", bytes, name_));
    b.bytes = bytes;
  }

  void Upload(Buffer& b, const void* data, size_t bytes, cl_mem_flags flags) {
    Ensure(b, bytes, flags);
    if (bytes)
      Check(clEnqueueWriteBuffer(queue_, b.mem, CL_FALSE, 0, bytes, data, 0, nullptr, nullptr),
            "writing to " + name_);
  }

  void Arg(cl_kernel k, cl_uint i, cl_mem m) {
    Check(clSetKernelArg(k, i, sizeof(cl_mem), &m), fmt::format("clSetKernelArg({})", i));
  }
  void Arg(cl_kernel k, cl_uint i, int64_t v) {
    cl_int x = static_cast<cl_int>(v);
    Check(clSetKernelArg(k, i, sizeof x, &x), fmt::format("clSetKernelArg({})", i));
  }

  void RunPrepare(cl_kernel k, const ImageBatch& in, const InputSpec& spec, void* out, size_t value_bytes) {
    CheckPrepare(in, spec);
    if (in.count == 0) return;
    const int64_t geometry[4] = {in.rows, in.cols, spec.height, spec.width};
    if (!std::equal(geometry, geometry + 4, geometry_)) {  // taps only change with the shapes
      Taps ty = MakeTaps(in.rows, spec.height), tx = MakeTaps(in.cols, spec.width);
      Upload(ty0_, ty.i0.data(), ty.i0.size() * 4, CL_MEM_READ_ONLY);
      Upload(ty1_, ty.i1.data(), ty.i1.size() * 4, CL_MEM_READ_ONLY);
      Upload(twy_, ty.w1.data(), ty.w1.size() * 4, CL_MEM_READ_ONLY);
      Upload(tx0_, tx.i0.data(), tx.i0.size() * 4, CL_MEM_READ_ONLY);
      Upload(tx1_, tx.i1.data(), tx.i1.size() * 4, CL_MEM_READ_ONLY);
      Upload(twx_, tx.w1.data(), tx.w1.size() * 4, CL_MEM_READ_ONLY);
      Check(clFinish(queue_), "uploading the resize taps to " + name_);  // the Taps vectors go now
      std::copy(geometry, geometry + 4, geometry_);
    }
    PrepareConstants kc = MakeConstants(spec);
    static_assert(sizeof(PrepareConstants) == 16 * sizeof(float), "prepare.cl's prepare_constants layout");
    // The bytes are what is uploaded: equal bytes need no upload (a bitwise test on purpose).
    if (!consts_.mem || std::memcmp(&kc, &consts_host_, sizeof kc) != 0) {  // NOLINT(bugprone-suspicious-memory-comparison)
      consts_host_ = kc;
      Upload(consts_, &consts_host_, sizeof consts_host_, CL_MEM_READ_ONLY);
    }
    const size_t in_bytes = static_cast<size_t>(in.count * in.rows * in.cols * in.channels);
    const size_t out_bytes = static_cast<size_t>(in.count * spec.channels * spec.height * spec.width) * value_bytes;
    Upload(px_, in.pixels, in_bytes, CL_MEM_READ_ONLY);
    Ensure(out_, out_bytes, CL_MEM_WRITE_ONLY);
    Arg(k, 0, px_.mem);
    Arg(k, 1, in.rows);
    Arg(k, 2, in.cols);
    Arg(k, 3, in.channels);
    Arg(k, 4, ty0_.mem);
    Arg(k, 5, ty1_.mem);
    Arg(k, 6, twy_.mem);
    Arg(k, 7, tx0_.mem);
    Arg(k, 8, tx1_.mem);
    Arg(k, 9, twx_.mem);
    Arg(k, 10, spec.height);
    Arg(k, 11, spec.width);
    Arg(k, 12, spec.channels);
    Arg(k, 13, consts_.mem);
    Arg(k, 14, out_.mem);
    size_t global[3] = {static_cast<size_t>(spec.width), static_cast<size_t>(spec.height), static_cast<size_t>(in.count)};
    Check(clEnqueueNDRangeKernel(queue_, k, 3, nullptr, global, nullptr, 0, nullptr, nullptr),
          "running prepare on " + name_);
    Check(clEnqueueReadBuffer(queue_, out_.mem, CL_TRUE, 0, out_bytes, out, 0, nullptr, nullptr),
          "reading prepared images from " + name_);
  }

  std::string name_;
  cl_device_id device_ = nullptr;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_program program_ = nullptr;
  cl_kernel prepare_ = nullptr, prepare_int8_ = nullptr, order_ = nullptr;
  Buffer px_, out_, ty0_, ty1_, twy_, tx0_, tx1_, twx_, consts_, keys_, order_buf_;
  int64_t geometry_[4] = {-1, -1, -1, -1};
  PrepareConstants consts_host_{};
};

}  // namespace

std::unique_ptr<Device> OpenOpenCl(const Config& config) { return std::make_unique<OpenClDevice>(config); }

std::string OpenClMissing(const Config& config) {
  try {
    Choose(config.platform);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace msaflow::kernels::fpga
