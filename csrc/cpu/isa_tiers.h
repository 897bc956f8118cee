// The ISA tiers of the kernels, lowest first: the one list of them. CMakeLists.txt reads the rows
// below for the tiers to build and their compiler flags (one row per line, as written here);
// cpu_dispatch.cpp expands them into its dispatch table, kernel_table.h into one kernel_table() per
// tier; setup.py reads the names for the build record and Python gets them from lk_moe._C.all_isas().
//
// X(name, CpuFeatures field saying that this CPU and OS can run it, compiler flags)
#pragma once

#define LK_ISA_TIERS(X)                                                                                     \
  X(generic, generic, "")                                                                                   \
  X(avx2, avx2, "-mavx2 -mfma -mf16c")                                                                      \
  X(avx512, avx512, "-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq")                       \
  X(avx512_bf16, avx512_bf16, "-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mavx512vbmi") \
  X(amx, amx, "-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mavx512vbmi -mamx-tile -mamx-bf16 -mamx-int8")
