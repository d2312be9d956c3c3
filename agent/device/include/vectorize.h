/* GS_WIDE marks a hot element loop to be compiled also for AVX2 and
 * AVX-512; the loader picks the best this CPU runs (GCC function
 * multiversioning), so the binary stays portable, e.g. to the GPU
 * machines the bundle goes to. The files using it build with -O3 in
 * release builds (GS_HOT_LOOP_OPTIONS, agent/CMakeLists.txt), whose vectorizer also takes loops
 * of any trip count. */
#ifndef GS_VECTORIZE_H
#define GS_VECTORIZE_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GS_WIDE __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GS_WIDE
#endif

#endif
