// The select step's reduction: the order of a round's candidates by metric, best first, ties
// broken by candidate id. The host turns each metric into a 64-bit key whose unsigned order is
// the metric's order (kernels/fpga/select.h) and lists the candidates in id order, so "better"
// is: a larger key, or an equal key and a smaller index. Every work-item counts the candidates
// better than its own, which is its place in the order (a permutation: the order is strict), and
// writes its index there. The champion is order[0], the top-k the first k. n comparators per
// candidate: on an FPGA a deep pipeline of comparators; thousands of candidates take a few
// milliseconds on a CPU device.
//
// OpenCL C 1.2: 64-bit integers are core; no extensions.
__kernel void order_by_key(__global const ulong* keys, uint n, __global uint* order) {
  const uint i = get_global_id(0);
  if (i >= n) return;
  const ulong ki = keys[i];
  uint place = 0;
  for (uint j = 0; j < n; ++j) {
    const ulong kj = keys[j];
    place += (kj > ki || (kj == ki && j < i)) ? 1u : 0u;
  }
  order[place] = i;
}
