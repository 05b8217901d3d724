// Where the time of an AMX pair product goes (src/quant/x86/amx.rs): its loop's skeleton for two
// 576-column panels (18 sub-blocks of 32) times 128 tokens, a tile of 16 tokens at a time, with
// the tile work alone, the scaling alone, both (each tile stored right after its product), and
// variants of both (more sub-blocks ahead, stores after the scaling as amx.rs issues them,
// tile-shaped activation rows, the tile work issued in
// the middle of a sub-block's scaling); against the VNNI product's dots alone. Needs a CPU and kernel with AMX (Linux 5.16+):
//   clang-16 -O2 -march=sapphirerapids -o amx_pair_skeleton tools/amx_pair_skeleton.c -lm
//   ./amx_pair_skeleton
// The values are arbitrary (finite, no denormals); only the timings mean anything.
#include <immintrin.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#define SUBS 18
#define TOK 128
#define BLK 44
typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint8_t acts[TOK*SUBS*BLK] __attribute__((aligned(64)));
static uint8_t acts32[SUBS*TOK*32] __attribute__((aligned(64)));   // [sub][token][32]
static uint8_t codes[SUBS*8*64] __attribute__((aligned(64)));
static float factors[SUBS*32] __attribute__((aligned(64)));
static int32_t sums[6][16][16] __attribute__((aligned(64)));
static float out[TOK][16];
static volatile float sink;
enum { FULL, TILES, SCALE, FULL_CONTIG };
// Sub-blocks computed ahead of the one scaled, whether a tile's store waits until after the
// scaling, and the sums buffers in rotation (ahead + 1).
static int AHEAD_N = 2, LATE = 0, NB = 3;
static void run(int mode) {
  int ahead = AHEAD_N;
  for (int t0 = 0; t0 < TOK; t0 += 16) {
    __m512 acc[16]; for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < SUBS; g++) {
      if (mode != SCALE) {
        const uint8_t *a; long stride;
        if (mode == FULL_CONTIG) { a = acts32 + (g*TOK + t0)*32; stride = 32; }
        else { a = acts + (t0*SUBS + g)*BLK + 12; stride = SUBS*BLK; }
        if (g & 1) { _tile_loadd(1, a, stride); _tile_loadd(3, codes + g*512, 64); _tile_zero(5); _tile_dpbsud(5, 1, 3); if (!LATE) _tile_stored(5, sums[g%NB], 64); }
        else { _tile_loadd(0, a, stride); _tile_loadd(2, codes + g*512, 64); _tile_zero(4); _tile_dpbsud(4, 0, 2); if (!LATE) _tile_stored(4, sums[g%NB], 64); }
      }
      if (mode != TILES && g >= ahead) {
        int h = g - ahead;
        __m512 scale = _mm512_load_ps(factors + h*32), offset = _mm512_load_ps(factors + h*32 + 16);
        for (int t = 0; t < 16; t++) {
          const uint8_t *blk = acts + ((t0+t)*SUBS + h)*BLK;
          float d = *(const float*)blk, ds = *(const float*)(blk+4);
          __m512i is = _mm512_load_si512(sums[h%NB][t]);
          __m512 sc = _mm512_mul_ps(scale, _mm512_set1_ps(d));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc[t]);
          acc[t] = _mm512_fnmadd_ps(offset, _mm512_set1_ps(ds), acc[t]);
        }
      }
      if (LATE && mode != SCALE) { if (g & 1) _tile_stored(5, sums[g%NB], 64); else _tile_stored(4, sums[g%NB], 64); }
    }
    for (int t = 0; t < 16; t++) _mm512_storeu_ps(out[t0+t], acc[t]);
  }
}

// The tile work of sub-block g + 2 issued in the middle of sub-block g's scaling, its store after.
static inline void tile_work(int t0, int n) {
  const uint8_t *a = acts + (t0*SUBS + n)*BLK + 12; long stride = SUBS*BLK;
  if (n & 1) { _tile_loadd(1, a, stride); _tile_loadd(3, codes + n*512, 64); _tile_zero(5); _tile_dpbsud(5, 1, 3); }
  else { _tile_loadd(0, a, stride); _tile_loadd(2, codes + n*512, 64); _tile_zero(4); _tile_dpbsud(4, 0, 2); }
}
static inline void tile_store(int n) { if (n & 1) _tile_stored(5, sums[n%3], 64); else _tile_stored(4, sums[n%3], 64); }
static void run_spread(int at) {
  for (int t0 = 0; t0 < TOK; t0 += 16) {
    __m512 acc[16]; for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
    tile_work(t0, 0); tile_store(0); tile_work(t0, 1); tile_store(1);
    for (int g = 0; g < SUBS; g++) {
      __m512 scale = _mm512_load_ps(factors + g*32), offset = _mm512_load_ps(factors + g*32 + 16);
      for (int t = 0; t < 16; t++) {
        if (t == at && g + 2 < SUBS) tile_work(t0, g + 2);
        const uint8_t *blk = acts + ((t0+t)*SUBS + g)*BLK;
        float d = *(const float*)blk, ds = *(const float*)(blk+4);
        __m512i is = _mm512_load_si512(sums[g%3][t]);
        __m512 sc = _mm512_mul_ps(scale, _mm512_set1_ps(d));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc[t]);
        acc[t] = _mm512_fnmadd_ps(offset, _mm512_set1_ps(ds), acc[t]);
      }
      if (g + 2 < SUBS) tile_store(g + 2);
    }
    for (int t = 0; t < 16; t++) _mm512_storeu_ps(out[t0+t], acc[t]);
  }
}
// VNNI-shaped reference of the dots alone: 8 vpdpbusd per token and sub-block (no scaling).
static void vnni_dots(void) {
  for (int t0 = 0; t0 < TOK; t0 += 8) {
    __m512i acc[8]; for (int t = 0; t < 8; t++) acc[t] = _mm512_setzero_si512();
    for (int g = 0; g < SUBS; g++) for (int k = 0; k < 8; k++) {
      __m512i c = _mm512_load_si512(codes + g*512 + k*64);
      for (int t = 0; t < 8; t++) acc[t] = _mm512_dpbusd_epi32(acc[t], c, _mm512_set1_epi32(*(const int*)(acts + ((t0+t)*SUBS+g)*BLK + 12 + 4*k)));
    }
    for (int t = 0; t < 8; t++) _mm512_storeu_si512(out[t0+t], acc[t]);
  }
}
int main() {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("no AMX permission\n"); return 1; }
  for (size_t i = 0; i < sizeof acts; i++) acts[i] = (i*7)&0x3f;
  for (int b = 0; b < TOK*SUBS; b++) { float d = 0.01f + 1e-4f*(b%13), ds = 0.5f + 1e-3f*(b%7); memcpy(acts + b*BLK, &d, 4); memcpy(acts + b*BLK + 4, &ds, 4); }
  for (size_t i = 0; i < sizeof acts32; i++) acts32[i] = (i*5)&0x3f;
  for (size_t i = 0; i < sizeof codes; i++) codes[i] = (i*3)&0xf;
  for (int i = 0; i < SUBS*32; i++) factors[i] = 1e-3f*(i%17);
  cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int s = 0; s < 2; s++) { c.rows[s] = 16; c.colsb[s] = 32; c.rows[2+s] = 8; c.colsb[2+s] = 64; c.rows[4+s] = 16; c.colsb[4+s] = 64; }
  _tile_loadconfig(&c);
  const char *names[] = {"full, stores first", "tiles only", "scaling only", "full, contiguous activations"};
  int variants[][3] = {{2,0,3},{3,0,4},{4,0,5},{2,1,3},{3,1,4}};
  for (int v = 0; v < 5; v++) {
    AHEAD_N = variants[v][0]; LATE = variants[v][1]; NB = variants[v][2];
    double best = 1e9;
    for (int r = 0; r < 20; r++) { double t = now(); for (int i = 0; i < 200; i++) run(FULL); best = fmin(best, (now()-t)/200); }
    printf("full, ahead %d, store %s: %6.2f us\n", AHEAD_N, LATE ? "after the scaling" : "right after the product", best*1e6);
  }
  AHEAD_N = 2; LATE = 0; NB = 3;
  for (int at = 0; at <= 12; at += 4) {
    double best = 1e9;
    for (int r = 0; r < 20; r++) { double t = now(); for (int i = 0; i < 200; i++) run_spread(at); best = fmin(best, (now()-t)/200); }
    printf("full, the tile work at token %d of the scaling: %6.2f us\n", at, best*1e6);
  }
  for (int round = 0; round < 2; round++) {
    for (int m = 0; m < 4; m++) {
      double best = 1e9;
      for (int r = 0; r < 20; r++) { double t = now(); for (int i = 0; i < 200; i++) run(m); best = fmin(best, (now()-t)/200); }
      printf("%-30s %6.2f us a pair product\n", names[m], best*1e6);
    }
    double best = 1e9;
    for (int r = 0; r < 20; r++) { double t = now(); for (int i = 0; i < 200; i++) vnni_dots(); best = fmin(best, (now()-t)/200); }
    printf("%-30s %6.2f us\n", "VNNI dots alone (no scaling)", best*1e6);
  }
  _tile_release();
  sink = out[3][5];
  return 0;
}
