#include "kernels/image_codec.h"

#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <jpeglib.h>

#include "common/error.h"

namespace msaflow::kernels {
namespace {

constexpr int64_t kMaxSide = 16384;

[[noreturn]] void Bad(const std::string& path, const std::string& what) {
  Throw(ErrorKind::kInvalidInput, path + ": " + what);
}

void CheckSize(const std::string& path, int64_t rows, int64_t cols) {
  if (rows < 1 || cols < 1) Bad(path, "an image of " + std::to_string(cols) + " x " + std::to_string(rows) + " pixels");
  if (rows > kMaxSide || cols > kMaxSide)
    Bad(path, std::to_string(cols) + " x " + std::to_string(rows) + " pixels; at most " + std::to_string(kMaxSide) + " a side");
}

DecodedImage DecodePng(std::string_view bytes, const std::string& path, bool header_only) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size()))
    Bad(path, std::string("not a readable PNG (") + img.message + ")");
  DecodedImage d;
  d.rows = img.height;
  d.cols = img.width;
  if (d.rows < 1 || d.cols < 1 || d.rows > kMaxSide || d.cols > kMaxSide) {
    png_image_free(&img);
    CheckSize(path, d.rows, d.cols);
  }
  const bool colour = (img.format & PNG_FORMAT_FLAG_COLOR) != 0;
  img.format = colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  d.channels = colour ? 3 : 1;
  if (header_only) {
    png_image_free(&img);
    return d;
  }
  d.pixels.resize(static_cast<size_t>(PNG_IMAGE_SIZE(img)));  // 32-bit in libpng: width x height x channels
  png_color black{0, 0, 0};
  if (!png_image_finish_read(&img, &black, d.pixels.data(), 0, nullptr)) {
    std::string why = img.message;
    png_image_free(&img);
    Bad(path, "corrupt or truncated PNG (" + why + ")");
  }
  return d;
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void OnJpegError(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void OnJpegWarning(j_common_ptr cinfo, int level) {
  // A corrupt-data warning (level -1) means missing or damaged data: an error here.
  if (level < 0) OnJpegError(cinfo);
}

DecodedImage DecodeJpeg(std::string_view bytes, const std::string& path, bool header_only) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = OnJpegError;
  err.mgr.emit_message = OnJpegWarning;
  err.message[0] = 0;
  DecodedImage d;  // outside the setjmp scope: no object with a destructor is skipped by longjmp
  std::string failure;
  jpeg_create_decompress(&cinfo);
  if (setjmp(err.jump)) {
    failure = err.message;
    jpeg_destroy_decompress(&cinfo);
    Bad(path, "corrupt or truncated JPEG (" + failure + ")");
  }
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.num_components != 1 && cinfo.num_components != 3) {
    int n = cinfo.num_components;
    jpeg_destroy_decompress(&cinfo);
    Bad(path, "a JPEG with " + std::to_string(n) + " components (CMYK?); expected gray or colour (YCbCr/RGB)");
  }
  cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  if (header_only) {  // unscaled: the output's size is the image's
    d.rows = cinfo.image_height;
    d.cols = cinfo.image_width;
    d.channels = cinfo.num_components;
    jpeg_destroy_decompress(&cinfo);
    CheckSize(path, d.rows, d.cols);
    return d;
  }
  jpeg_start_decompress(&cinfo);
  d.rows = cinfo.output_height;
  d.cols = cinfo.output_width;
  d.channels = cinfo.output_components;
  if (d.rows > kMaxSide || d.cols > kMaxSide) {
    jpeg_destroy_decompress(&cinfo);
    CheckSize(path, d.rows, d.cols);
  }
  d.pixels.resize(static_cast<size_t>(d.rows * d.cols * d.channels));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = d.pixels.data() + static_cast<size_t>(cinfo.output_scanline) * static_cast<size_t>(d.cols * d.channels);
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return d;
}

DecodedImage Decode(std::string_view bytes, const std::string& path, bool header_only) {
  if (bytes.empty()) Bad(path, "an empty file (0 bytes)");
  static const unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return DecodePng(bytes, path, header_only);
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xff && static_cast<unsigned char>(bytes[1]) == 0xd8 &&
      static_cast<unsigned char>(bytes[2]) == 0xff)
    return DecodeJpeg(bytes, path, header_only);
  Bad(path, "neither PNG nor JPEG (by its first bytes)");
}

}  // namespace

DecodedImage DecodeImage(std::string_view bytes, const std::string& path) { return Decode(bytes, path, false); }

DecodedImage ReadImageHeader(std::string_view bytes, const std::string& path) { return Decode(bytes, path, true); }

}  // namespace msaflow::kernels
