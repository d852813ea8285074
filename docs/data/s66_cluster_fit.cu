// Session 66: how many clusters of 1, 2, 4 and 8 CTAs fit at once with the grouped GEMM's launch shape
// (384 threads, BN = 256's dynamic shared memory), i.e. how many SMs a persistent kernel of that cluster size uses.
// Build: nvcc -arch=sm_90a -o cluster_fit docs/data/s66_cluster_fit.cu
#include <cstdio>
#include <cuda_runtime.h>

__global__ void occupant() {}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const int smem = 227 * 1024 - 1024;  // the kernel's opt-in is close to the 227 KiB limit: one CTA per SM
  if (cudaFuncSetAttribute(occupant, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaFuncSetAttribute(occupant, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    std::fprintf(stderr, "cudaFuncSetAttribute failed\n");
    return 1;
  }
  std::printf("%s, %d SMs, %d B dynamic shared memory, 384 threads\n", prop.name, sms, smem);
  for (int cl : {1, 2, 4, 8}) {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cl;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(cl * 64);
    cfg.blockDim = dim3(384);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&n, occupant, &cfg);
    if (err != cudaSuccess) {
      std::printf("cluster %d: %s\n", cl, cudaGetErrorString(err));
      continue;
    }
    std::printf("cluster %d: %d co-resident clusters = %d SMs busy, %d idle\n", cl, n, n * cl, sms - n * cl);
  }
  return 0;
}
