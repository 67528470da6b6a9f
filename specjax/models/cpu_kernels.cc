// Small-M matrix products for XLA:CPU decode steps: out[M, N] = x[M, K] @ W[K, N], M <= ~64.
//
// Why our own kernel: a decode step of a memory-bound target multiplies 1 .. gamma+1 token rows by
// every weight matrix. The ideal cost is one pass over the weights for any M <= 8 (the FLOPs per
// weight byte stay tiny), but XLA:CPU lowers M = 1 to a matrix-vector thunk and M = 2..8 to GEMM
// paths that re-read or re-pack the weights, so a (gamma+1)-token verification block cost 1.4-2.6
// one-token steps on 2-core hosts. Here the weights are stored once in a packed layout (panels of
// kPanel output columns, each panel contiguous over K), and one pass streams each panel exactly
// once while all M rows accumulate in registers.
//
// The panel width is the ISA's: 32 columns (2 vectors) on AVX-512, whose 32 registers hold an
// 8-row tile; 16 columns (2 vectors) on AVX2, whose 16 registers hold a 6-row tile (12
// accumulators). With 32-column panels on AVX2 a tile held 2 rows, and the second tile of a
// 4-token block re-read each panel from L2 after the DRAM stream had passed: the block's
// products cost ~1.3 one-token products; with 6-row tiles they cost about one up to 6 rows
// (gamma <= 5). Tiles of one or two rows take two adjacent panels at once on AVX2 (kPairRows),
// so a one-token step keeps 4 independent accumulator chains per row as with 32-column panels.
//
// Exactness: every output element is one fused multiply-add chain over k = 0 .. K-1 in the same
// order, whatever M, the row tile or the thread that computes it. So a K-token block gives bitwise
// the same logits as K one-token steps (tests check this), and greedy speculative decoding stays
// token-identical to greedy decoding.
//
// Weights may be float32, bfloat16 (widened exactly to float32 in registers) or int8 with one
// float32 scale per output column (out = scale[n] * sum_k x[m, k] * q[k, n]). Arithmetic is float32
// throughout. Work is split over panels between the caller and the kernels' own worker threads.
//
// Layout (built by specjax/models/cpu_kernels.py `pack`):
//   w:     [P, K, kPanel]  P = ceil(N / kPanel); w[p, k, j] = W[k, p * kPanel + j], zero padded
//   scale: [P * kPanel]    float32 (int8 only; ignored otherwise)

#include <immintrin.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
#define SPECJAX_DEFAULT_PANEL 32  // output columns per panel (the packed layout's contract)
#define SPECJAX_DEFAULT_ROWS 8    // row tile: 8 rows x 2 vectors = 16 accumulators of 32 registers
#define SPECJAX_DEFAULT_PAIR_ROWS 0
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vbroadcast(float s) { return _mm512_set1_ps(s); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline float hsum(Vec a) { return _mm512_reduce_add_ps(a); }
inline float hmax(Vec a) { return _mm512_reduce_max_ps(a); }
inline Vec vround(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT); }
inline Vec vpow2i(Vec n) {  // 2^n for integral n in float range
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline Vec vzero_below(Vec y, Vec x, float lo) {  // y where x >= lo, else 0
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_GE_OQ), y);
}
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vor_unordered(Vec acc, Vec e) {  // acc, all bits set in the lanes where e is NaN
  return _mm512_mask_mov_ps(acc, _mm512_cmp_ps_mask(e, e, _CMP_UNORD_Q),
                            _mm512_castsi512_ps(_mm512_set1_epi32(-1)));
}
inline bool vany(Vec a) {  // any bit set
  return _mm512_test_epi32_mask(_mm512_castps_si512(a), _mm512_castps_si512(a)) != 0;
}
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vload_bf16(const uint16_t* p) {
  __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline Vec vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
#define SPECJAX_DEFAULT_PANEL 16  // output columns per panel (the packed layout's contract)
#define SPECJAX_DEFAULT_ROWS 6    // row tile: 6 rows x 2 vectors = 12 accumulators of 16 registers
#define SPECJAX_DEFAULT_PAIR_ROWS 2  // tiles of <= 2 rows run over two adjacent panels
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vbroadcast(float s) { return _mm256_set1_ps(s); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline float hsum(Vec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float hmax(Vec a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline Vec vround(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vpow2i(Vec n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline Vec vzero_below(Vec y, Vec x, float lo) {
  return _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(lo), _CMP_GE_OQ));
}
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vor_unordered(Vec acc, Vec e) {
  return _mm256_or_ps(acc, _mm256_cmp_ps(e, e, _CMP_UNORD_Q));
}
inline bool vany(Vec a) { return _mm256_movemask_ps(a) != 0; }  // a lane's sign bit set
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vload_bf16(const uint16_t* p) {
  __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline Vec vload_i8(const int8_t* p) {
  int64_t bytes;
  std::memcpy(&bytes, p, sizeof(bytes));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)));
}
#else
#error "specjax cpu_kernels needs AVX2 with FMA, or AVX-512"
#endif

// The tile, overridable at build time (cpu_kernels.py `variant`: side-by-side benchmarks of other
// tiles, e.g. -DSPECJAX_PANEL=32 -DSPECJAX_ROWS=2 -DSPECJAX_PAIR_ROWS=0, the AVX2 tile before).
#ifndef SPECJAX_PANEL
#define SPECJAX_PANEL SPECJAX_DEFAULT_PANEL
#endif
#ifndef SPECJAX_ROWS
#define SPECJAX_ROWS SPECJAX_DEFAULT_ROWS
#endif
#ifndef SPECJAX_PAIR_ROWS
#define SPECJAX_PAIR_ROWS SPECJAX_DEFAULT_PAIR_ROWS
#endif
constexpr int64_t kPanel = SPECJAX_PANEL;
constexpr int kRows = SPECJAX_ROWS;
constexpr int kPairRows = SPECJAX_PAIR_ROWS;
static_assert(kPanel % kLanes == 0 && kRows >= 1 && kPairRows >= 0 && kPairRows <= kRows,
              "SPECJAX_PANEL must be a multiple of the vector width; 0 <= PAIR_ROWS <= ROWS");
constexpr int kVecs = kPanel / kLanes;  // vectors per panel row
#ifndef SPECJAX_PREFETCH
#define SPECJAX_PREFETCH 4096
#endif
constexpr int64_t kPrefetch = SPECJAX_PREFETCH;  // bytes ahead of the row being read

inline Vec load_weights(const float* p) { return vload(p); }
inline Vec load_weights(const uint16_t* p) { return vload_bf16(p); }
inline Vec load_weights(const int8_t* p) { return vload_i8(p); }

// Rows [0, R) of x times NP adjacent panels (NP * kPanel columns, `cols` of them real): R * kVecs
// * NP accumulators, one pass over the panels' K rows (NP streams).
template <int R, int NP, typename W>
inline void panel_tile(const float* x, int64_t ldx, const W* w, int64_t k_dim, const float* scale,
                       float* out, int64_t ldo, int64_t cols) {
  constexpr int kV = kVecs * NP;
  Vec acc[R][kV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) acc[r][v] = vzero();
  constexpr int64_t kRowBytes = kPanel * sizeof(W);
  const int64_t stride = k_dim * kPanel;  // from one panel to the next
  for (int64_t k = 0; k < k_dim; ++k) {
    // Software prefetch kPrefetch bytes ahead: with several rows per weight the loop issues loads
    // too slowly for the hardware prefetcher to keep DRAM busy (measured: 6 rows streamed at 2/3
    // of the 1-row rate without it). Past the panel's end it reads the next panel: harmless.
    for (int j = 0; j < NP; ++j)
      for (int64_t b = 0; b < kRowBytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + j * stride + k * kPanel) + kPrefetch + b,
                     _MM_HINT_T0);
    Vec wv[kV];
    for (int j = 0; j < NP; ++j)
      for (int v = 0; v < kVecs; ++v)
        wv[j * kVecs + v] = load_weights(w + j * stride + k * kPanel + v * kLanes);
    for (int r = 0; r < R; ++r) {
      Vec xb = vbroadcast(x[r * ldx + k]);
      for (int v = 0; v < kV; ++v) acc[r][v] = vfma(xb, wv[v], acc[r][v]);
    }
  }
  if (scale != nullptr) {  // scales of adjacent panels are adjacent
    for (int v = 0; v < kV; ++v) {
      Vec s = vload(scale + v * kLanes);
      for (int r = 0; r < R; ++r) acc[r][v] = vmul(acc[r][v], s);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (cols == NP * kPanel) {
      for (int v = 0; v < kV; ++v) vstore(out + r * ldo + v * kLanes, acc[r][v]);
    } else {  // the last panel of an N that is not a multiple of kPanel
      alignas(64) float tmp[NP * kPanel];
      for (int v = 0; v < kV; ++v) vstore(tmp + v * kLanes, acc[r][v]);
      std::memcpy(out + r * ldo, tmp, cols * sizeof(float));
    }
  }
}

// Rows [0, rest) with 0 < rest < kRows: the tile of exactly `rest` rows (chosen at compile time).
template <int R, int NP, typename W>
inline void tail_tile(int64_t rest, const float* x, int64_t k_dim, const W* w, const float* scale,
                      float* out, int64_t n_dim, int64_t cols) {
  if constexpr (R >= 1) {
    if (rest == R) return panel_tile<R, NP>(x, k_dim, w, k_dim, scale, out, n_dim, cols);
    tail_tile<R - 1, NP>(rest, x, k_dim, w, scale, out, n_dim, cols);
  }
}

// Panels [p, p + np) (np = 1 or 2) for all M rows: a pair in one pass when M <= kPairRows.
template <typename W>
void run_panels(const float* x, int64_t m_dim, int64_t k_dim, int64_t n_dim, const W* w,
                const float* scale, float* out, int64_t p, int64_t np) {
  const W* wp = w + p * k_dim * kPanel;
  const float* sp = scale == nullptr ? nullptr : scale + p * kPanel;
  float* op = out + p * kPanel;
  if constexpr (kPairRows > 0) {
    if (np == 2 && m_dim <= kPairRows) {
      const int64_t cols = std::min(2 * kPanel, n_dim - p * kPanel);
      return tail_tile<kPairRows, 2>(m_dim, x, k_dim, wp, sp, op, n_dim, cols);
    }
  }
  for (int64_t j = 0; j < np; ++j, wp += k_dim * kPanel, op += kPanel) {
    const float* sj = sp == nullptr ? nullptr : sp + j * kPanel;
    const int64_t cols = std::min(kPanel, n_dim - (p + j) * kPanel);
    int64_t m = 0;
    for (; m + kRows <= m_dim; m += kRows)  // later row tiles re-read the panel from L1/L2
      panel_tile<kRows, 1>(x + m * k_dim, k_dim, wp, k_dim, sj, op + m * n_dim, n_dim, cols);
    if (m < m_dim)
      tail_tile<kRows - 1, 1>(m_dim - m, x + m * k_dim, k_dim, wp, sj, op + m * n_dim, n_dim,
                              cols);
  }
}

// Worker threads that stay hot between the kernel calls of a decode step.
//
// A step makes ~20 kernel calls of 20-100 us each, a few microseconds apart. Tasks scheduled on
// XLA's intra-op pool started too late to help (measured: a 2-thread call ran no faster than one
// thread), so the kernels keep their own workers (one fewer than the CPUs this process may use;
// SPECJAX_CPU_KERNEL_THREADS overrides). A worker spins for a short while after each job, then
// sleeps on a condition variable; a job is split into chunks taken from an atomic counter by the
// caller and the workers, and the caller waits only for chunks already claimed.
class Workers {
 public:
  static Workers& get() {
    static Workers* workers = new Workers();  // never destroyed: threads outlive static teardown
    return *workers;
  }

  // fn(c) for every c in [0, chunks). Runs inline when there is one chunk, no worker, or another
  // thread's job in flight (XLA may run two independent kernel calls at once).
  template <typename F>
  void run(int64_t chunks, const F& fn) {
    if (chunks <= 1 || threads_.empty() || !busy_.try_lock()) {
      for (int64_t c = 0; c < chunks; ++c) fn(c);
      return;
    }
    Job job{&invoke<F>, &fn, chunks};
    job_.store(&job, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    drain(job);
    while (job.done.load(std::memory_order_acquire) < chunks) _mm_pause();
    job_.store(nullptr, std::memory_order_seq_cst);
    while (active_.load(std::memory_order_seq_cst) > 0) _mm_pause();
    busy_.unlock();
  }

 private:
  struct Job {
    void (*call)(const void*, int64_t);
    const void* fn;
    int64_t chunks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    Job(void (*c)(const void*, int64_t), const void* f, int64_t n) : call(c), fn(f), chunks(n) {}
  };

  template <typename F>
  static void invoke(const void* fn, int64_t c) { (*static_cast<const F*>(fn))(c); }

  static void drain(Job& job) {
    for (;;) {
      const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
      if (c >= job.chunks) return;
      job.call(job.fn, c);
      job.done.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  Workers() {
    int n = 0;
    if (const char* env = std::getenv("SPECJAX_CPU_KERNEL_THREADS")) n = std::atoi(env);
    if (n <= 0) {
      cpu_set_t set;
      n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                         : static_cast<int>(std::thread::hardware_concurrency());
    }
    for (int i = 1; i < n; ++i) threads_.emplace_back([this] { loop(); });
    for (auto& t : threads_) t.detach();
  }

  void loop() {
    uint64_t seen = generation_.load(std::memory_order_seq_cst);
    for (;;) {
      // Spin ~100-200 us (a decode step's gaps between kernel calls are far shorter), then sleep.
      // Yielding while spinning lets XLA's own threads (parallel fusions) have this CPU.
      for (int i = 0; i < 4000 && generation_.load(std::memory_order_acquire) == seen; ++i) {
        for (int j = 0; j < 8 && generation_.load(std::memory_order_relaxed) == seen; ++j)
          _mm_pause();
        sched_yield();
      }
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
      }
      seen = generation_.load(std::memory_order_seq_cst);
      active_.fetch_add(1, std::memory_order_seq_cst);
      if (Job* job = job_.load(std::memory_order_seq_cst)) drain(*job);
      active_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex busy_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<Job*> job_{nullptr};
  std::atomic<int> active_{0};
  std::atomic<int> sleeping_{0};
};

// fn(p, np) for panels [p, p + np) (np = 2 but at the end) of an N-column weight, split over the
// caller and the workers in chunks of an even number of panels, about 64 KiB of weights: enough
// chunks to balance two threads, few enough to keep the counter cheap.
template <typename W, typename F>
void for_panels(int64_t k_dim, int64_t n_dim, const F& fn) {
  const int64_t panels = (n_dim + kPanel - 1) / kPanel;
  const int64_t panel_bytes = k_dim * kPanel * static_cast<int64_t>(sizeof(W));
  const int64_t fit = std::max<int64_t>(1, (64 * 1024) / std::max<int64_t>(panel_bytes, 1));
  const int64_t per_chunk = 2 * ((fit + 1) / 2);
  const int64_t chunks = (panels + per_chunk - 1) / per_chunk;
  Workers::get().run(chunks, [&](int64_t c) {
    const int64_t p_end = std::min(panels, (c + 1) * per_chunk);
    for (int64_t p = c * per_chunk; p < p_end; p += 2) fn(p, std::min<int64_t>(2, p_end - p));
  });
}

template <typename W>
void matmul(const float* x, int64_t m_dim, int64_t k_dim, int64_t n_dim,
            const W* w, const float* scale, float* out) {
  for_panels<W>(k_dim, n_dim, [=](int64_t p, int64_t np) {
    run_panels(x, m_dim, k_dim, n_dim, w, scale, out, p, np);
  });
}

// The same product over segments: x [B, S, K] -> out [B, S, N], only rows s < rows[b] of segment
// b computed and the rest zero. An encoder's padded source positions are masked out of everything
// downstream, so it multiplies only each source's own tokens (the same FMA chain per row).
template <typename W>
void matmul_rows(const float* x, int64_t b_dim, int64_t s_dim, int64_t k_dim, int64_t n_dim,
                 const W* w, const float* scale, const int32_t* rows, float* out) {
  for (int64_t b = 0; b < b_dim; ++b) {
    const int64_t r = std::clamp<int64_t>(rows[b], 0, s_dim);
    if (r < s_dim)
      std::memset(out + (b * s_dim + r) * n_dim, 0, (s_dim - r) * n_dim * sizeof(float));
  }
  for_panels<W>(k_dim, n_dim, [=](int64_t p, int64_t np) {
    for (int64_t b = 0; b < b_dim; ++b) {
      const int64_t r = std::clamp<int64_t>(rows[b], 0, s_dim);
      if (r > 0)
        run_panels(x + b * s_dim * k_dim, r, k_dim, n_dim, w, scale, out + b * s_dim * n_dim, p,
                   np);
    }
  });
}

ffi::Error packed_matmul_rows(ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w,
                              ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::S32> rows,
                              ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto od = out->dimensions();
  if (xd.size() != 3 || wd.size() != 3 || od.size() != 3 || wd[2] != kPanel ||
      rows.element_count() != static_cast<size_t>(xd[0]) || od[0] != xd[0] || od[1] != xd[1] ||
      wd[1] != xd[2] || wd[0] * kPanel < od[2])
    return ffi::Error::InvalidArgument(
        "packed_matmul_rows: expected x [B, S, K], w [P, K, kPanel], rows [B], out [B, S, N]");
  const int64_t b_dim = xd[0], s_dim = xd[1], k_dim = xd[2], n_dim = od[2];
  const float* xs = x.typed_data();
  const int32_t* rs = rows.typed_data();
  float* os = out->typed_data();
  switch (w.element_type()) {
    case ffi::DataType::F32:
      matmul_rows(xs, b_dim, s_dim, k_dim, n_dim, w.typed_data<float>(), nullptr, rs, os);
      break;
    case ffi::DataType::BF16:
      matmul_rows(xs, b_dim, s_dim, k_dim, n_dim, static_cast<const uint16_t*>(w.untyped_data()),
                  nullptr, rs, os);
      break;
    case ffi::DataType::S8:
      if (static_cast<int64_t>(scale.element_count()) < wd[0] * kPanel)
        return ffi::Error::InvalidArgument(
            "packed_matmul_rows: int8 weights need P * kPanel scales");
      matmul_rows(xs, b_dim, s_dim, k_dim, n_dim, w.typed_data<int8_t>(), scale.typed_data(), rs,
                  os);
      break;
    default:
      return ffi::Error::InvalidArgument("packed_matmul_rows: weights must be f32, bf16 or int8");
  }
  return ffi::Error::Success();
}

// x [..., M', K] (leading dims fold into M), w [1.., P, K, kPanel], out [..., N]: the leading 1s
// and folded dims are what jax's vmap (expand_dims) adds.
ffi::Error packed_matmul(ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w,
                         ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto od = out->dimensions();
  const size_t xr = xd.size(), wr = wd.size(), orank = od.size();
  if (xr < 2 || wr < 3 || orank != xr || wd[wr - 1] != kPanel)
    return ffi::Error::InvalidArgument(
        "packed_matmul: expected x [M, K], w [P, K, kPanel], out [M, N] (specjax_panel_width)");
  for (size_t i = 0; i + 3 < wr; ++i)
    if (wd[i] != 1) return ffi::Error::InvalidArgument("packed_matmul: batched weights");
  int64_t m_dim = 1;
  for (size_t i = 0; i + 1 < xr; ++i) {
    if (xd[i] != od[i]) return ffi::Error::InvalidArgument("packed_matmul: x and out disagree");
    m_dim *= xd[i];
  }
  const int64_t k_dim = xd[xr - 1], n_dim = od[orank - 1], panels = wd[wr - 3];
  if (wd[wr - 2] != k_dim || panels * kPanel < n_dim)
    return ffi::Error::InvalidArgument("packed_matmul: shapes of x, w and out disagree");
  const float* xs = x.typed_data();
  float* os = out->typed_data();
  switch (w.element_type()) {
    case ffi::DataType::F32:
      matmul(xs, m_dim, k_dim, n_dim, w.typed_data<float>(), nullptr, os);
      break;
    case ffi::DataType::BF16:
      matmul(xs, m_dim, k_dim, n_dim, static_cast<const uint16_t*>(w.untyped_data()),
             nullptr, os);
      break;
    case ffi::DataType::S8:
      if (static_cast<int64_t>(scale.element_count()) < panels * kPanel)
        return ffi::Error::InvalidArgument("packed_matmul: int8 weights need P * kPanel scales");
      matmul(xs, m_dim, k_dim, n_dim, w.typed_data<int8_t>(), scale.typed_data(), os);
      break;
    default:
      return ffi::Error::InvalidArgument("packed_matmul: weights must be f32, bf16 or int8");
  }
  return ffi::Error::Success();
}

// ----------------------------------------------------------------------------- decode attention
//
// T5 attention of a few query rows against a cache: out[b, q, h*Dk:(h+1)*Dk] =
// softmax_t(q . k[t] + bias[t]) @ v (no 1/sqrt(d) scaling). XLA:CPU ran these small batched
// products as separate dot thunks with layout copies around them (a quarter of a 6-token step);
// here one call does all heads. Each query row goes through the same code whatever the number of
// rows, so a K-token block matches K one-token steps bitwise.

// exp(x) for x <= 0 (scores minus their maximum): Cody-Waite reduction and Cephes' degree-6
// polynomial (about 1 ulp); exactly 0 below -88 as the float32 exp underflows.
constexpr float kExpLo = -88.0f;
inline float exp_poly(float r) {
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  return y * r * r + r + 1.0f;
}
inline float exp_scalar(float x) {
  if (x < kExpLo) return 0.0f;
  const float n = __builtin_nearbyintf(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return exp_poly(r) * scale;
}
inline Vec exp_vec(Vec x) {
  const Vec xc = vmax(x, vbroadcast(kExpLo));
  const Vec n = vround(vmul(xc, vbroadcast(1.44269504088896341f)));
  const Vec r = vsub(vsub(xc, vmul(n, vbroadcast(0.693359375f))), vmul(n, vbroadcast(-2.12194440e-4f)));
  Vec y = vbroadcast(1.9875691500e-4f);
  y = vfma(y, r, vbroadcast(1.3981999507e-3f));
  y = vfma(y, r, vbroadcast(8.3334519073e-3f));
  y = vfma(y, r, vbroadcast(4.1665795894e-2f));
  y = vfma(y, r, vbroadcast(1.6666665459e-1f));
  y = vfma(y, r, vbroadcast(5.0000001201e-1f));
  y = vadd(vadd(vmul(vmul(y, r), r), r), vbroadcast(1.0f));
  return vzero_below(vmul(y, vpow2i(n)), x, kExpLo);
}

// One query row: s[t] = q . k[t] + bias[t] (T entries, k rows Dk apart), softmax, out = w @ v.
void attend_row(const float* q, const float* k, const float* v, const float* bias, int64_t t_dim,
                int64_t d_dim, float* s, float* out) {
  const int64_t dv = d_dim - d_dim % kLanes;
  float m = -3.0e38f;
  for (int64_t t = 0; t < t_dim; ++t) {
    const float* kt = k + t * d_dim;
    Vec acc = vzero();
    for (int64_t d = 0; d < dv; d += kLanes) acc = vfma(vload(q + d), vload(kt + d), acc);
    float dot = hsum(acc);
    for (int64_t d = dv; d < d_dim; ++d) dot += q[d] * kt[d];
    s[t] = dot + bias[t];
    m = std::max(m, s[t]);
  }
  const int64_t tv = t_dim - t_dim % kLanes;
  Vec zv = vzero();
  for (int64_t t = 0; t < tv; t += kLanes) {
    const Vec e = exp_vec(vsub(vload(s + t), vbroadcast(m)));
    vstore(s + t, e);
    zv = vadd(zv, e);
  }
  float z = hsum(zv);
  for (int64_t t = tv; t < t_dim; ++t) {
    s[t] = exp_scalar(s[t] - m);
    z += s[t];
  }
  for (int64_t t = 0; t < tv; t += kLanes) vstore(s + t, vdiv(vload(s + t), vbroadcast(z)));
  for (int64_t t = tv; t < t_dim; ++t) s[t] = s[t] / z;
  for (int64_t d = 0; d < dv; d += kLanes) {
    Vec acc = vzero();
    for (int64_t t = 0; t < t_dim; ++t) acc = vfma(vbroadcast(s[t]), vload(v + t * d_dim + d), acc);
    vstore(out + d, acc);
  }
  for (int64_t d = dv; d < d_dim; ++d) {
    float acc = 0.0f;
    for (int64_t t = 0; t < t_dim; ++t) acc += s[t] * v[t * d_dim + d];
    out[d] = acc;
  }
}

// q [B, Q, H, Dk], k/v [B, H, T, Dk], bias [B|1, H|1, Q|1, T] (size-1 dims broadcast),
// out [B, Q, H, Dk]. Threads split (b, h) pairs when there is enough work.
using F32x4 = ffi::Buffer<ffi::F32, 4>;
// Below this many multiply-adds one thread does it all; above, the (hot) workers split the (b, h)
// pairs: at 2^16 a 4-token block's self-attention splits, a one-token step's does not
// (experiments/bench_variant.py measures other thresholds; docs/cpu_kernels.md).
#ifndef SPECJAX_ATTENTION_SERIAL
#define SPECJAX_ATTENTION_SERIAL (1 << 16)
#endif

ffi::Error attention(F32x4 q, F32x4 k, F32x4 v, F32x4 bias,
                     ffi::Result<F32x4> out) {
  auto qd = q.dimensions(), kd = k.dimensions(), bd = bias.dimensions();
  const int64_t b_dim = qd[0], q_dim = qd[1], h_dim = qd[2], d_dim = qd[3], t_dim = kd[2];
  if (kd[0] != b_dim || kd[1] != h_dim || kd[3] != d_dim || v.dimensions()[2] != t_dim ||
      bd[3] != t_dim || (bd[0] != 1 && bd[0] != b_dim) || (bd[1] != 1 && bd[1] != h_dim) ||
      (bd[2] != 1 && bd[2] != q_dim))
    return ffi::Error::InvalidArgument("attention: shapes of q, k, v and bias disagree");
  const int64_t sb = bd[0] == 1 ? 0 : bd[1] * bd[2] * t_dim;
  const int64_t sh = bd[1] == 1 ? 0 : bd[2] * t_dim;
  const int64_t sq = bd[2] == 1 ? 0 : t_dim;
  const float *qs = q.typed_data(), *ks = k.typed_data(), *vs = v.typed_data();
  const float* bs = bias.typed_data();
  float* os = out->typed_data();
  const int64_t work = b_dim * h_dim * q_dim * t_dim * d_dim;
  const int64_t pairs = b_dim * h_dim;
  auto run = [=](int64_t c) {
    const int64_t b = c / h_dim, h = c % h_dim;
    std::unique_ptr<float[]> s(new float[t_dim + kLanes]);
    const float* kh = ks + (b * h_dim + h) * t_dim * d_dim;
    const float* vh = vs + (b * h_dim + h) * t_dim * d_dim;
    for (int64_t i = 0; i < q_dim; ++i) {
      const int64_t row = ((b * q_dim + i) * h_dim + h) * d_dim;
      attend_row(qs + row, kh, vh, bs + b * sb + h * sh + i * sq, t_dim, d_dim, s.get(), os + row);
    }
  };
  if (work < SPECJAX_ATTENTION_SERIAL) {  // a few microseconds: splitting would cost more
    for (int64_t c = 0; c < pairs; ++c) run(c);
  } else {
    Workers::get().run(pairs, run);
  }
  return ffi::Error::Success();
}

// ----------------------------------------------------------------------------- sampling
//
// The inverse-CDF draw of one token per row from non-negative weights w[V] given a uniform u in
// [0, 1): the first t with w_0 + .. + w_t > u * sum(w), summed in double. XLA:CPU computes a
// cumulative sum over V as a dozen reduce-window passes (tens of microseconds per draw at
// V = 4000); one sequential pass here takes about a microsecond. A zero-weight token has an empty
// interval and is never drawn; rounding past the end returns the last token with positive weight.

ffi::Error sample_cdf(ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> u,
                      ffi::ResultBuffer<ffi::S32> out) {
  const auto wd = w.dimensions();
  if (wd.size() < 1) return ffi::Error::InvalidArgument("sample_cdf: weights need a last axis");
  const int64_t v = wd[wd.size() - 1];
  const int64_t rows = static_cast<int64_t>(w.element_count()) / std::max<int64_t>(v, 1);
  if (static_cast<int64_t>(u.element_count()) != rows ||
      static_cast<int64_t>(out->element_count()) != rows)
    return ffi::Error::InvalidArgument("sample_cdf: one uniform and one token per row");
  const float* ws = w.typed_data();
  const float* us = u.typed_data();
  int32_t* os = out->typed_data();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = ws + r * v;
    double total = 0.0;
    int64_t last = v - 1;
    bool any = false;
    for (int64_t t = 0; t < v; ++t) {
      total += row[t];
      if (row[t] > 0.0f) {
        last = t;
        any = true;
      }
    }
    if (!any) last = v - 1;
    const double point = static_cast<double>(us[r]) * total;
    double acc = 0.0;
    int64_t pick = last;
    for (int64_t t = 0; t < last; ++t) {
      acc += row[t];
      if (acc > point) {
        pick = t;
        break;
      }
    }
    os[r] = static_cast<int32_t>(pick);
  }
  return ffi::Error::Success();
}

// ----------------------------------------------------------------------------- rows and argmax
//
// Two small operations of every decode step that XLA:CPU makes dear next to the kernels above:
// an embedding lookup of a few token rows is a gather that XLA splits over its own thread pool,
// whose threads wake (tens of microseconds) while the kernels' workers hold the cores; an argmax
// over V is two reductions that XLA rewrites into three thunks each. One call on the caller's
// thread does either in a microsecond or two.

// out[i, :] = table[id, :] for each id of `ids`, with jnp's indexing rule: a negative id counts
// from the end, then ids are clamped to [0, V). Any element type (rows are copied as bytes).
ffi::Error take_rows(ffi::AnyBuffer table, ffi::Buffer<ffi::S32> ids,
                     ffi::Result<ffi::AnyBuffer> out) {
  const auto td = table.dimensions();
  if (td.size() != 2 || td[0] < 1 || out->element_type() != table.element_type())
    return ffi::Error::InvalidArgument("take_rows: expected a table [V, D] and out of its type");
  const int64_t v = td[0], n = static_cast<int64_t>(ids.element_count());
  const size_t row_bytes = table.size_bytes() / static_cast<size_t>(v);
  if (out->size_bytes() != row_bytes * static_cast<size_t>(n))
    return ffi::Error::InvalidArgument("take_rows: out must hold one table row per id");
  const char* src = static_cast<const char*>(table.untyped_data());
  char* dst = static_cast<char*>(out->untyped_data());
  const int32_t* is = ids.typed_data();
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = is[i];
    if (r < 0) r += v;
    r = std::clamp<int64_t>(r, 0, v - 1);
    std::memcpy(dst + i * row_bytes, src + r * row_bytes, row_bytes);
  }
  return ffi::Error::Success();
}

// out[r] = the first index of the maximum of row r of x [..., V], or of its first NaN (as
// jnp.argmax). A vector pass finds the maximum and whether any NaN occurs; a scalar pass the
// first index that holds it (x == max also matches -0.0 against 0.0, as jnp's comparison does).
ffi::Error argmax_rows(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::S32> out) {
  const auto xd = x.dimensions();
  if (xd.size() < 1 || xd[xd.size() - 1] < 1)
    return ffi::Error::InvalidArgument("argmax_rows: x needs a non-empty last axis");
  const int64_t v = xd[xd.size() - 1];
  const int64_t rows = static_cast<int64_t>(x.element_count()) / v;
  if (static_cast<int64_t>(out->element_count()) != rows)
    return ffi::Error::InvalidArgument("argmax_rows: one index per row");
  const float* xs = x.typed_data();
  int32_t* os = out->typed_data();
  const int64_t vv = v - v % kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xs + r * v;
    Vec mv = vbroadcast(-std::numeric_limits<float>::infinity());
    Vec nan = vzero();
    for (int64_t t = 0; t < vv; t += kLanes) {
      const Vec e = vload(row + t);
      mv = vmax(mv, e);
      nan = vor_unordered(nan, e);
    }
    float m = hmax(mv);
    bool any_nan = vany(nan);
    for (int64_t t = vv; t < v; ++t) {
      any_nan = any_nan || std::isnan(row[t]);
      m = std::max(m, row[t]);
    }
    int64_t pick = 0;
    for (int64_t t = 0; t < v; ++t) {
      if (any_nan ? std::isnan(row[t]) : row[t] == m) {
        pick = t;
        break;
      }
    }
    os[r] = static_cast<int32_t>(pick);
  }
  return ffi::Error::Success();
}

}  // namespace


XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxPackedMatmul, packed_matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxPackedMatmulRows, packed_matmul_rows,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxAttention, attention,
                              ffi::Ffi::Bind()
                                  .Arg<F32x4>()
                                  .Arg<F32x4>()
                                  .Arg<F32x4>()
                                  .Arg<F32x4>()
                                  .Ret<F32x4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxSampleCdf, sample_cdf,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxTakeRows, take_rows,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxArgmax, argmax_rows,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

// The packed layout's panel width for this build (cpu_kernels.py `panel_width`).
extern "C" int64_t SpecjaxPanelWidth() { return kPanel; }
