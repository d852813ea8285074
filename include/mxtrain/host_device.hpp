#pragma once
// MXT_HOST_DEVICE marks a function of a pure C++ header (host code and tests use it) that device code calls as well.
#ifdef __CUDACC__
#define MXT_HOST_DEVICE __host__ __device__
#else
#define MXT_HOST_DEVICE
#endif
