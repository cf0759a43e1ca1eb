// PNG and JPEG decoding (libpng, libjpeg-turbo): a file's bytes -> 8-bit gray or RGB pixels.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace msaflow::kernels {

struct DecodedImage {
  int64_t rows = 0, cols = 0, channels = 0;  // channels 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;                // rows * cols * channels, HWC
};

// Decodes by content (PNG or JPEG signature). Gray (with or without alpha, any bit depth) stays
// gray; colour, palette and alpha images become RGB (alpha composited on black). Throws
// kInvalidInput naming `path` for an empty file, an unknown format, a corrupt or truncated
// image, a CMYK JPEG, or an image larger than 16384 pixels a side.
DecodedImage DecodeImage(std::string_view bytes, const std::string& path);

// The size and channels DecodeImage would give (pixels left empty), from the header alone: no
// pixel is decoded. Throws as DecodeImage does for what the header shows (a JPEG's header may
// follow its metadata: `bytes` must reach the start of the image data).
DecodedImage ReadImageHeader(std::string_view bytes, const std::string& path);

}  // namespace msaflow::kernels
