// Kernels with known local-memory lines for tests/sass_local_memory_test.sh (compiled to a cubin, never linked).
__global__ void indexed_local(const int* idx, float* out) {
  float buf[256];  // too large for registers, and indexed at run time: local memory
#pragma unroll 1
  for (int i = 0; i < 256; ++i) buf[i] = out[i];  // MARK-STL
  out[threadIdx.x] = buf[idx[threadIdx.x] & 255];  // MARK-LDL
}

__global__ void in_registers(const float* in, float* out) {
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc += in[threadIdx.x + 32 * i] * static_cast<float>(i);
  out[threadIdx.x] = acc;
}

// 48 values live across a reduction at 32 registers a thread (1024 threads, 2 blocks an SM): register spills.
__global__ void __launch_bounds__(1024, 2) spilling(const float* in, float* out) {
  float v[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) v[i] = in[threadIdx.x + 1024 * i];
  float m = v[0];
#pragma unroll
  for (int i = 1; i < 48; ++i) m = fmaxf(m, v[i]);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 48; ++i) s += __expf(v[i] - m);  // MARK-SPILL: every v is read again after the max
  out[threadIdx.x] = s;
}
