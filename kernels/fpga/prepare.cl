// Image preparation for a backbone, one batch per launch: bilinear resize to the model's input,
// gray replicated to RGB (or RGB kept, or RGB reduced to luma for a gray model), per-channel
// normalisation, and an int8 path. One work-item per output pixel (x, y, image); it writes every
// output channel of that pixel. The host passes the resize taps and all constants, computed
// once by the C++ code (kernels/prepare.cc), and the arithmetic below is the C++ arithmetic
// operation for operation with contraction off, so the two backends agree bit for bit.
//
// OpenCL C 1.2 (Intel FPGA SDK for OpenCL, PoCL): no extensions, no doubles.
#pragma OPENCL FP_CONTRACT OFF

typedef struct {
  float k255;
  float mean[3], inv_std[3], inv_q[3], q_scale[3];
  float luma[3];
} prepare_constants;

// The interpolated 0..255 values of output pixel (x, y) of image n, one per output channel
// source (v[0..cin-1]; luma folded into v[0] when a gray model reads RGB).
inline void sample(__global const uchar* px, int rows, int cols, int cin, int cout, int n, int y, int x,
                   __global const int* ty0, __global const int* ty1, __global const float* twy,
                   __global const int* tx0, __global const int* tx1, __global const float* twx,
                   __constant prepare_constants* k, float v[3]) {
  const long stride = (long)cols * cin;
  __global const uchar* img = px + (long)n * rows * stride;
  __global const uchar* r0 = img + ty0[y] * stride;
  __global const uchar* r1 = img + ty1[y] * stride;
  const float wy = twy[y], wx = twx[x];
  const int a = tx0[x] * cin, b = tx1[x] * cin;
  for (int c = 0; c < cin; ++c) {
    float top = (float)r0[a + c] + (float)((int)r0[b + c] - (int)r0[a + c]) * wx;
    float bot = (float)r1[a + c] + (float)((int)r1[b + c] - (int)r1[a + c]) * wx;
    v[c] = top + (bot - top) * wy;
  }
  if (cin == 3 && cout == 1) {
    float l = k->luma[0] * v[0] + k->luma[1] * v[1];
    v[0] = l + k->luma[2] * v[2];
  }
}

inline float normalised(const float v[3], int c, int cin, __constant prepare_constants* k) {
  float g = v[min(c, cin - 1)] * k->k255;
  return (g - k->mean[c]) * k->inv_std[c];
}

// The two kernels' common arguments, and the start they share: this work-item's pixel, its
// sampled values v, and where its channels go in the output.
#define PREPARE_ARGS                                                                               \
  __global const uchar *px, int rows, int cols, int cin, __global const int *ty0,                 \
      __global const int *ty1, __global const float *twy, __global const int *tx0,                \
      __global const int *tx1, __global const float *twx, int height, int width, int cout,        \
      __constant prepare_constants *k
#define PREPARE_PIXEL                                                                              \
  const int x = get_global_id(0), y = get_global_id(1), n = get_global_id(2);                     \
  if (x >= width || y >= height) return;                                                           \
  float v[3];                                                                                      \
  sample(px, rows, cols, cin, cout, n, y, x, ty0, ty1, twy, tx0, tx1, twx, k, v);                 \
  const long plane = (long)height * width;                                                         \
  const long o = (long)n * cout * plane + (long)y * width + x

__kernel void prepare(PREPARE_ARGS, __global float* out) {
  PREPARE_PIXEL;
  for (int c = 0; c < cout; ++c) out[o + c * plane] = normalised(v, c, cin, k);
}

__kernel void prepare_int8(PREPARE_ARGS, __global char* out) {
  PREPARE_PIXEL;
  for (int c = 0; c < cout; ++c) out[o + c * plane] = convert_char_sat_rte(normalised(v, c, cin, k) * k->inv_q[c]);
}
