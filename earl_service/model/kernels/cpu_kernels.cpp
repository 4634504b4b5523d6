// The C++ CPU kernels of one training step.
//
// Fused RotatE negative distances: dist[b, k] = sum_i |q[b, i] - ent[idx[b, k], i]| over complex dims i.
// Entities are stored as (N, 2d) reals: real parts in columns [0, d), imaginary parts in [d, 2d).
// Neither pass materialises the (B, K, 2d) gather; the backward recomputes the moduli.
//
// CSR x dense products (the GNN's aggregations): each output row is written once, no zero-filled buffer, and a
// bfloat16 dense side (autocast) is read as is and accumulated in the matrix's precision.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

// Counting sort of the flat (b, k) positions by entity id: both passes then walk the entity table in
// order (each row is read once and stays in L1 while its ~B*K/N uses are processed); the (B, 2d) queries
// are the randomly accessed side, and they fit in L2.
static void sort_by_entity(const int64_t* idx, int64_t n, int64_t N, int64_t* order, int64_t* offsets) {
  std::fill(offsets, offsets + N + 1, 0);
  for (int64_t p = 0; p < n; ++p) {
    TORCH_CHECK(idx[p] >= 0 && idx[p] < N, "candidate id out of range");
    ++offsets[idx[p] + 1];
  }
  for (int64_t e = 0; e < N; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets, offsets + N);
  for (int64_t p = 0; p < n; ++p) order[next[idx[p]]++] = p;
}

// sum_i |q_i - e_i| over d complex dims, q and e as [re | im] rows of 2d reals (both passes' inner loop).
template <typename scalar_t>
static inline scalar_t row_distance(const scalar_t* q, const scalar_t* e, int64_t d, scalar_t eps) {
  const scalar_t* qi = q + d;
  const scalar_t* ei = e + d;
  scalar_t acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < d; ++i) {
    scalar_t re = q[i] - e[i];
    scalar_t im = qi[i] - ei[i];
    acc += std::sqrt(re * re + im * im + eps);
  }
  return acc;
}

template <typename scalar_t>
static void forward_kernel(const scalar_t* q, const scalar_t* ent, const int64_t* order, const int64_t* offsets,
                           scalar_t* out, int64_t N, int64_t K, int64_t d, scalar_t eps) {
  at::parallel_for(0, N, 64, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const scalar_t* row = ent + e * 2 * d;
      for (int64_t p = offsets[e]; p < offsets[e + 1]; ++p) {
        const int64_t flat = order[p];
        out[flat] = row_distance(q + (flat / K) * 2 * d, row, d, eps);
      }
    }
  });
}

// Positions [0, n) sorted by entity, cut into `parts` ranges of whole entities with about n / parts positions each.
static std::vector<int64_t> entity_ranges(const int64_t* offsets, int64_t N, int64_t parts) {
  std::vector<int64_t> bounds(parts + 1, N);
  bounds[0] = 0;
  for (int64_t k = 1; k < parts; ++k)
    bounds[k] = std::lower_bound(offsets, offsets + N + 1, offsets[N] * k / parts) - offsets;
  return bounds;
}

template <typename scalar_t>
static void backward_kernel(const scalar_t* q, const scalar_t* ent, const int64_t* order, const int64_t* offsets,
                            const scalar_t* g, scalar_t* gq, scalar_t* gent, int64_t B, int64_t N, int64_t K,
                            int64_t d, scalar_t eps) {
  // Each part owns a range of entities (their gradient rows are its alone) and walks its positions with the whole
  // row in one loop; the query gradients it adds go to a private (B, 2d) copy, summed into gq at the end (part 0
  // writes gq itself). No atomics; a query row is touched by every part, an entity row by one.
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(N, at::get_num_threads()));
  const std::vector<int64_t> bounds = entity_ranges(offsets, N, parts);
  const int64_t width = 2 * d;
  std::vector<scalar_t> copies((parts - 1) * B * width, scalar_t(0));
  at::parallel_for(0, parts, 1, [&](int64_t first, int64_t last) {
    for (int64_t part = first; part < last; ++part) {
      scalar_t* gq_part = part == 0 ? gq : copies.data() + (part - 1) * B * width;
      for (int64_t e = bounds[part]; e < bounds[part + 1]; ++e) {
        const scalar_t* er = ent + e * width;
        const scalar_t* ei = er + d;
        scalar_t* ger = gent + e * width;
        scalar_t* gei = ger + d;
        for (int64_t p = offsets[e]; p < offsets[e + 1]; ++p) {
          const int64_t flat = order[p];
          const scalar_t w = g[flat];
          if (w == 0) continue;
          const int64_t b = flat / K;
          const scalar_t* qr = q + b * width;
          const scalar_t* qi = qr + d;
          scalar_t* gqr = gq_part + b * width;
          scalar_t* gqi = gqr + d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) {
            scalar_t re = qr[i] - er[i];
            scalar_t im = qi[i] - ei[i];
            scalar_t s = w / std::sqrt(re * re + im * im + eps);
            gqr[i] += s * re;
            gqi[i] += s * im;
            ger[i] -= s * re;
            gei[i] -= s * im;
          }
        }
      }
    }
  });
  if (parts > 1) {
    at::parallel_for(0, B, 16, [&](int64_t b0, int64_t b1) {
      for (int64_t part = 1; part < parts; ++part) {
        const scalar_t* src = copies.data() + (part - 1) * B * width;
        for (int64_t b = b0; b < b1; ++b) {
#pragma omp simd
          for (int64_t i = 0; i < width; ++i) gq[b * width + i] += src[b * width + i];
        }
      }
    });
  }
}

// All-pairs distances for ranking: out[b, j] = sum_i |q[b, i] - ent[j, i]|. Tiles of entities stay in L1
// while the whole query block (in L2) streams past them.
template <typename scalar_t>
static void all_pairs_kernel(const scalar_t* q, const scalar_t* ent, scalar_t* out, int64_t B, int64_t N,
                             int64_t d, scalar_t eps) {
  const int64_t tile = 32;
  at::parallel_for(0, (N + tile - 1) / tile, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t j0 = t0 * tile; j0 < std::min(N, t1 * tile); j0 += tile) {
      const int64_t j1 = std::min(N, j0 + tile);
      for (int64_t b = 0; b < B; ++b) {
        const scalar_t* row = q + b * 2 * d;
        for (int64_t j = j0; j < j1; ++j) out[b * N + j] = row_distance(row, ent + j * 2 * d, d, eps);
      }
    }
  });
}

static void check(const torch::Tensor& q, const torch::Tensor& ent, const torch::Tensor& idx) {
  TORCH_CHECK(q.dim() == 2 && ent.dim() == 2 && idx.dim() == 2, "expected q (B, 2d), ent (N, 2d), idx (B, K)");
  TORCH_CHECK(q.size(1) == ent.size(1) && q.size(1) % 2 == 0, "q and ent need the same even width");
  TORCH_CHECK(idx.size(0) == q.size(0), "idx and q need the same batch size");
  TORCH_CHECK(q.is_contiguous() && ent.is_contiguous() && idx.is_contiguous(), "inputs must be contiguous");
  TORCH_CHECK(idx.scalar_type() == torch::kInt64, "idx must be int64");
  TORCH_CHECK(q.scalar_type() == ent.scalar_type(), "q and ent must share a dtype");
  TORCH_CHECK(!q.is_cuda() && !ent.is_cuda(), "this kernel is CPU-only");
}

std::vector<torch::Tensor> rotate_dist_forward(torch::Tensor q, torch::Tensor ent, torch::Tensor idx, double eps) {
  check(q, ent, idx);
  const int64_t N = ent.size(0), K = idx.size(1), d = q.size(1) / 2;
  auto out = torch::empty({idx.size(0), K}, q.options());
  auto order = torch::empty({idx.numel()}, idx.options());
  auto offsets = torch::empty({N + 1}, idx.options());
  sort_by_entity(idx.data_ptr<int64_t>(), idx.numel(), N, order.data_ptr<int64_t>(), offsets.data_ptr<int64_t>());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rotate_dist_forward", [&] {
    forward_kernel<scalar_t>(q.data_ptr<scalar_t>(), ent.data_ptr<scalar_t>(), order.data_ptr<int64_t>(),
                             offsets.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), N, K, d,
                             static_cast<scalar_t>(eps));
  });
  return {out, order, offsets};
}

std::vector<torch::Tensor> rotate_dist_backward(torch::Tensor grad, torch::Tensor q, torch::Tensor ent,
                                                torch::Tensor order, torch::Tensor offsets, int64_t K, double eps) {
  grad = grad.contiguous();
  const int64_t N = ent.size(0), d = q.size(1) / 2;
  auto gq = torch::zeros_like(q);
  auto gent = torch::zeros_like(ent);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rotate_dist_backward", [&] {
    backward_kernel<scalar_t>(q.data_ptr<scalar_t>(), ent.data_ptr<scalar_t>(), order.data_ptr<int64_t>(),
                              offsets.data_ptr<int64_t>(), grad.data_ptr<scalar_t>(), gq.data_ptr<scalar_t>(),
                              gent.data_ptr<scalar_t>(), q.size(0), N, K, d, static_cast<scalar_t>(eps));
  });
  return {gq, gent};
}

torch::Tensor rotate_dist_all(torch::Tensor q, torch::Tensor ent, double eps) {
  TORCH_CHECK(q.dim() == 2 && ent.dim() == 2 && q.size(1) == ent.size(1) && q.size(1) % 2 == 0,
              "expected q (B, 2d) and ent (N, 2d)");
  TORCH_CHECK(q.scalar_type() == ent.scalar_type() && !q.is_cuda() && !ent.is_cuda(), "CPU tensors of one dtype");
  q = q.contiguous();
  ent = ent.contiguous();
  const int64_t B = q.size(0), N = ent.size(0), d = q.size(1) / 2;
  auto out = torch::empty({B, N}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rotate_dist_all", [&] {
    all_pairs_kernel<scalar_t>(q.data_ptr<scalar_t>(), ent.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), B, N, d,
                               static_cast<scalar_t>(eps));
  });
  return out;
}

// One CSR matrix x dense rows: the arrays and the dense side, checked once.
struct Csr {
  torch::Tensor crow, col, val, x;

  Csr(torch::Tensor crow_, torch::Tensor col_, torch::Tensor val_, torch::Tensor x_)
      : crow(crow_.contiguous()), col(col_.contiguous()), val(val_.contiguous()), x(x_.contiguous()) {
    TORCH_CHECK(crow.dim() == 1 && col.dim() == 1 && val.dim() == 1 && x.dim() == 2, "expected CSR arrays and x (M, w)");
    TORCH_CHECK(crow.scalar_type() == torch::kLong && col.scalar_type() == torch::kLong, "int64 CSR indices");
    TORCH_CHECK(!x.is_cuda() && !val.is_cuda(), "CPU tensors");
    TORCH_CHECK(val.scalar_type() == torch::kFloat || val.scalar_type() == torch::kDouble, "float32/64 matrix values");
    TORCH_CHECK(x.scalar_type() == val.scalar_type() ||
                    (val.scalar_type() == torch::kFloat && x.scalar_type() == torch::kBFloat16),
                "x must have the matrix's dtype (or bfloat16 for float32)");
    const int64_t n = rows();
    TORCH_CHECK(n >= 0 && col.numel() == val.numel(), "inconsistent CSR arrays");
    const int64_t* r = crow.data_ptr<int64_t>();
    TORCH_CHECK(r[0] == 0 && r[n] == col.numel() && std::is_sorted(r, r + n + 1), "malformed CSR row pointers");
    const int64_t* c = col.data_ptr<int64_t>();
    const int64_t m = x.size(0);
    TORCH_CHECK(std::all_of(c, c + col.numel(), [m](int64_t j) { return j >= 0 && j < m; }),
                "a column index is out of x's rows");
  }
  int64_t rows() const { return crow.numel() - 1; }
};

// Entries read ahead of the one being summed: each reads a random row of x (w numbers, 0.6-1.2 KB for FB15k-237's
// messages), so without a prefetch every entry waits for memory; ~8 rows in flight hide that wait and fit in L1.
constexpr int64_t kPrefetchAhead = 8;

template <typename T>
static inline void prefetch_row(const T* row, int64_t w) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < w * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(bytes + off, 0, 3);
}

// acc[0:w) += sum_p val[p] * x[col[p]] over row i's entries, in V's precision.
template <typename V, typename T>
static inline void add_row(const Csr& a, const V* val, const T* x, int64_t i, int64_t w, V* acc) {
  const int64_t* crow = a.crow.data_ptr<int64_t>();
  const int64_t* col = a.col.data_ptr<int64_t>();
  const int64_t nnz = a.col.numel();
  for (int64_t p = crow[i]; p < crow[i + 1]; ++p) {
    if (p + kPrefetchAhead < nnz) prefetch_row(x + col[p + kPrefetchAhead] * w, w);  // also the next rows' entries
    const V v = val[p];
    const T* xr = x + col[p] * w;
#pragma omp simd
    for (int64_t c = 0; c < w; ++c) acc[c] += v * static_cast<V>(xr[c]);
  }
}

// f(typed pointer of t's data): float, double or bfloat16.
template <typename F>
static void with_data(const torch::Tensor& t, F f) {
  if (t.scalar_type() == torch::kBFloat16)
    f(t.data_ptr<at::BFloat16>());
  else if (t.scalar_type() == torch::kDouble)
    f(t.data_ptr<double>());
  else
    f(t.data_ptr<float>());
}

// Row ranges of about equal work (entries + 1 per row), several per thread: a graph's rows differ in degree by
// orders of magnitude and ids follow first appearance, so equal row counts would leave one thread most of the work.
static std::vector<int64_t> balanced_rows(const Csr& a, const Csr* b) {
  const int64_t n = a.rows();
  const int64_t* ca = a.crow.data_ptr<int64_t>();
  const int64_t* cb = b ? b->crow.data_ptr<int64_t>() : nullptr;
  auto work = [&](int64_t i) { return ca[i] + (cb ? cb[i] : 0) + i; };  // non-decreasing in i
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(n, 8 * at::get_num_threads()));
  std::vector<int64_t> bounds(parts + 1, n);
  bounds[0] = 0;
  int64_t lo = 0;
  for (int64_t k = 1; k < parts; ++k) {
    const int64_t target = work(n) * k / parts;
    int64_t hi = n;
    while (lo < hi) {  // the first row whose cumulative work reaches the target
      const int64_t mid = lo + (hi - lo) / 2;
      if (work(mid) < target) lo = mid + 1; else hi = mid;
    }
    bounds[k] = lo;
  }
  return bounds;
}

// out[i] = a[i] @ a.x (+ b[i] @ b.x) (+ bias): each row summed in V's precision in a buffer that stays in L1, then
// stored once as O.
template <typename V, typename O>
static void csr_rows(const Csr& a, const Csr* b, const V* bias, O* out, int64_t w) {
  const V* a_val = a.val.data_ptr<V>();
  const V* b_val = b ? b->val.data_ptr<V>() : nullptr;
  const std::vector<int64_t> bounds = balanced_rows(a, b);
  with_data(a.x, [&](auto* ax) {
    with_data(b ? b->x : a.x, [&](auto* bx) {
      at::parallel_for(0, static_cast<int64_t>(bounds.size()) - 1, 1, [&](int64_t first, int64_t last) {
        std::vector<V> acc(w);
        for (int64_t i = bounds[first]; i < bounds[last]; ++i) {
          V* s = acc.data();
          if (bias)
            std::copy(bias, bias + w, s);
          else
            std::fill(s, s + w, V(0));
          add_row(a, a_val, ax, i, w, s);
          if (b) add_row(*b, b_val, bx, i, w, s);
          O* o = out + i * w;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) o[c] = static_cast<O>(s[c]);
        }
      });
    });
  });
}

// mat @ x in the matrix's precision, written in it or (a float32 matrix) as bfloat16.
torch::Tensor csr_mm(torch::Tensor crow, torch::Tensor col, torch::Tensor val, torch::Tensor x, bool bf16_out) {
  Csr a(crow, col, val, x);
  const bool f32 = a.val.scalar_type() == torch::kFloat;
  TORCH_CHECK(f32 || !bf16_out, "a bfloat16 result needs a float32 matrix");
  const int64_t w = a.x.size(1);
  auto out = torch::empty({a.rows(), w}, a.x.options().dtype(bf16_out ? torch::kBFloat16 : a.val.scalar_type()));
  if (bf16_out)
    csr_rows<float, at::BFloat16>(a, nullptr, nullptr, out.data_ptr<at::BFloat16>(), w);
  else if (f32)
    csr_rows<float, float>(a, nullptr, nullptr, out.data_ptr<float>(), w);
  else
    csr_rows<double, double>(a, nullptr, nullptr, out.data_ptr<double>(), w);
  return out;
}

// A @ x + B @ y + bias (a GNN layer's aggregation: messages, relation terms, self-loop bias) written once.
torch::Tensor csr_mm_sum(torch::Tensor a_crow, torch::Tensor a_col, torch::Tensor a_val, torch::Tensor x,
                         torch::Tensor b_crow, torch::Tensor b_col, torch::Tensor b_val, torch::Tensor y,
                         torch::Tensor bias) {
  Csr a(a_crow, a_col, a_val, x), b(b_crow, b_col, b_val, y);
  const auto dtype = a.val.scalar_type();
  const int64_t w = a.x.size(1);
  TORCH_CHECK(b.val.scalar_type() == dtype && b.rows() == a.rows() && b.x.size(1) == w, "A and B must match");
  TORCH_CHECK(bias.dim() == 1 && bias.numel() == w && bias.scalar_type() == dtype, "bias (w,) in the matrices' dtype");
  bias = bias.contiguous();
  auto out = torch::empty({a.rows(), w}, a.x.options().dtype(dtype));
  if (dtype == torch::kFloat)
    csr_rows<float, float>(a, &b, bias.data_ptr<float>(), out.data_ptr<float>(), w);
  else
    csr_rows<double, double>(a, &b, bias.data_ptr<double>(), out.data_ptr<double>(), w);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("csr_mm", &csr_mm, "CSR matrix x dense rows in the matrix's precision; float32 with bfloat16 in or out (CPU)");
  m.def("csr_mm_sum", &csr_mm_sum, "A @ x + B @ y + bias in the matrices' precision, x and y may be bfloat16 (CPU)");
  m.def("forward", &rotate_dist_forward, "fused RotatE negative distances (CPU)");
  m.def("all_pairs", &rotate_dist_all, "RotatE distances of every query to every entity (CPU, no grad)");
  m.def("backward", &rotate_dist_backward, "gradients of the fused RotatE negative distances (CPU)");
}
