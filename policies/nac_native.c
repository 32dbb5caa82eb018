#include <stdint.h>
#include <math.h>
#include <stdlib.h>

/* x86-64 with GCC >= 11 on Linux: one clone of the scoring code per instruction-set level (AVX-512, AVX2 + FMA,
   baseline SSE2), the best one picked by the loader (an ifunc), so the cached .so stays portable (no
   -march=native). Elsewhere one baseline build. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__linux__)
#define NAC_X86 1
#define NAC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NAC_X86 0
#define NAC_CLONES
#endif

/* "a ranks above b": NaN above every number (torch.topk's order), then the larger value, then the lower index */
static inline int above(float a, int64_t ia, float b, int64_t ib) {
    if (isnan(a) || isnan(b)) return isnan(a) && (!isnan(b) || ia < ib);
    return a > b || (a == b && ia < ib);
}

/* insert (x, j) into the sorted list v/ix of length k if it ranks above its last entry; -inf never enters */
static inline void consider(float x, int64_t j, int64_t k, float *v, int64_t *ix) {
    if (x == -INFINITY || !above(x, j, v[k - 1], ix[k - 1])) return;
    int64_t p = k - 1;
    while (p > 0 && above(x, j, v[p - 1], ix[p - 1])) { v[p] = v[p - 1]; ix[p] = ix[p - 1]; --p; }
    v[p] = x; ix[p] = j;
}

#define G 64

/* consider() for numbers (no NaN) met in index order, so every listed index is below j and an equal listed
   value stays ahead: x's place is the count of listed values >= x, and the list is rebuilt around it, with
   no data-dependent branch but "does x enter" (vector compares and blends for W = 8, where a shifting loop
   mispredicts its exit). The list is W wide (W a constant where inlined, >= k): the top W of the numbers
   offered, so its first k are their top k. -inf never enters (the empty slots hold -inf). */
static inline __attribute__((always_inline)) void insert_in_order(float x, int64_t j, float *v, int64_t *ix,
                                                                   const int W) {
    int pos = 0;
    for (int p = 0; p < W; ++p) pos += v[p] >= x;
    if (pos >= W) return;
    float ov[33];
    int64_t oi[33];  /* W <= 32 */
    for (int p = 0; p < W; ++p) { ov[p + 1] = v[p]; oi[p + 1] = ix[p]; }
    ov[0] = x; oi[0] = j;
    for (int p = 0; p < W; ++p) {  /* p < pos: unchanged; p == pos: x; p > pos: shifted by one */
        v[p] = p < pos ? ov[p + 1] : (p == pos ? x : ov[p]);
        ix[p] = p < pos ? oi[p + 1] : (p == pos ? j : oi[p]);
    }
}

/* Pass 2 of topk_row: the top k of s[0..len) (len a multiple of 16, no NaN) into v/ix, given th0 <= the
   k-th largest score. The row is read in order, 16 scores at a time: one vector compare gives the mask of
   those that reach the threshold th, and only those are looked at; th rises to the k-th best score found so
   far. The list is kept W = 8 or 32 wide (insert_in_order). MASK16 is the mask of s[j0..j0+16) >= th: one
   version per instruction set on x86-64 (picked once, when the library is loaded), else plain C. */
#define SCAN_WIDTH(W, MASK16)                                                                       \
    do {                                                                                            \
        float lv[W], th = th0;                                                                      \
        int64_t li[W];                                                                              \
        for (int p = 0; p < W; ++p) { lv[p] = -INFINITY; li[p] = -1; }                              \
        for (int64_t j0 = 0; j0 < len; j0 += 16) {                                                  \
            unsigned m = MASK16;                                                                    \
            while (m) {                                                                             \
                const int64_t j = j0 + __builtin_ctz(m);                                            \
                m &= m - 1;                                                                         \
                if (s[j] >= th) {                                                                   \
                    insert_in_order(s[j], j, lv, li, W);                                            \
                    th = lv[k - 1] > th0 ? lv[k - 1] : th0;                                         \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        for (int64_t p = 0; p < k; ++p) { v[p] = lv[p]; ix[p] = li[p]; }                            \
    } while (0)
#define SCAN(MASK16) do { if (k <= 8) SCAN_WIDTH(8, MASK16); else SCAN_WIDTH(32, MASK16); } while (0)

static inline unsigned mask16_plain(const float *x, float th) {
    unsigned m = 0;
    for (int t = 0; t < 16; ++t) m |= (unsigned)(x[t] >= th) << t;
    return m;
}

static void scan_plain(const float *s, int64_t len, int64_t k, float th0, float *v, int64_t *ix) {
    SCAN(mask16_plain(s + j0, th));
}

#if NAC_X86
#include <immintrin.h>

/* AVX-512: no branch per score that reaches th0. Every score >= th0 is appended to a candidate list (vector
   compress, in index order); then each candidate's rank is the count of candidates above it (larger value, or
   equal value and earlier), and the candidate goes straight to that slot. The top k are among the candidates,
   and every score ranking above one of them is a candidate too, so these ranks are the ranks in the row.
   More than CAP candidates (many ties at th0) take the branchy scan. */
#define CAP 64

__attribute__((target("arch=x86-64-v4")))
static void scan_avx512(const float *s, int64_t len, int64_t k, float th0, float *v, int64_t *ix) {
    float cv[CAP + 16];
    int32_t ci[CAP + 16];
    int nc = 0;
    if (len <= INT32_MAX) {
        /* 64 blocks of 16 scores at a time: the masks of all blocks first (no branch), then only the blocks
           with a score >= th0 are compressed into the list */
        const __m512 t = _mm512_set1_ps(th0);
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (int64_t c0 = 0; c0 < len && nc <= CAP; c0 += 64 * 16) {
            const int blocks = len - c0 >= 64 * 16 ? 64 : (int)((len - c0) / 16);
            __mmask16 masks[64];
            uint64_t any = 0;
            for (int b = 0; b < blocks; ++b) {
                masks[b] = _mm512_cmp_ps_mask(_mm512_loadu_ps(s + c0 + 16 * b), t, _CMP_GE_OQ);
                any |= (uint64_t)(masks[b] != 0) << b;
            }
            while (any && nc <= CAP) {
                const int b = __builtin_ctzll(any);
                any &= any - 1;
                const int64_t j0 = c0 + 16 * b;
                _mm512_storeu_ps(cv + nc, _mm512_maskz_compress_ps(masks[b], _mm512_loadu_ps(s + j0)));
                _mm512_storeu_si512((void *)(ci + nc), _mm512_maskz_compress_epi32(
                    masks[b], _mm512_add_epi32(lane, _mm512_set1_epi32((int)j0))));
                nc += __builtin_popcount(masks[b]);
            }
        }
    }
    if (len > INT32_MAX || nc > CAP) {
        SCAN((unsigned)_mm512_cmp_ps_mask(_mm512_loadu_ps(s + j0), _mm512_set1_ps(th), _CMP_GE_OQ));
        return;
    }
    float ov[CAP];
    int32_t oi[CAP];
    for (int i = 0; i < nc; ++i) {
        const __m512 x = _mm512_set1_ps(cv[i]);
        int rank = 0;
        for (int c = 0; c < nc; c += 16) {
            const int live = nc - c >= 16 ? 16 : nc - c, before = i - c <= 0 ? 0 : (i - c >= 16 ? 16 : i - c);
            const __mmask16 in = (__mmask16)((1u << live) - 1), earlier = (__mmask16)((1u << before) - 1);
            const __m512 y = _mm512_loadu_ps(cv + c);
            rank += __builtin_popcount(_mm512_mask_cmp_ps_mask(in, y, x, _CMP_GT_OQ))
                    + __builtin_popcount(_mm512_mask_cmp_ps_mask(earlier, y, x, _CMP_EQ_OQ));
        }
        ov[rank] = cv[i];
        oi[rank] = ci[i];
    }
    for (int p = 0; p < k && p < nc && ov[p] != -INFINITY; ++p) { v[p] = ov[p]; ix[p] = oi[p]; }
}

__attribute__((target("arch=x86-64-v3")))
static inline unsigned mask16_avx2(const float *x, float th) {
    const __m256 t = _mm256_set1_ps(th);
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x), t, _CMP_GE_OQ))
           | (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + 8), t, _CMP_GE_OQ)) << 8;
}

__attribute__((target("arch=x86-64-v3")))
static void scan_avx2(const float *s, int64_t len, int64_t k, float th0, float *v, int64_t *ix) {
    SCAN(mask16_avx2(s + j0, th));
}

typedef void (*scan_fn)(const float *, int64_t, int64_t, float, float *, int64_t *);
static scan_fn scan = scan_plain;

static int best_level(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") ? 2 : __builtin_cpu_supports("x86-64-v3") ? 1 : 0;
}

__attribute__((constructor)) static void pick_scan(void) {
    const scan_fn by_level[3] = {scan_plain, scan_avx2, scan_avx512};
    scan = by_level[best_level()];
}

/* For tests: use the scan of instruction-set level `level` (0 plain C, 1 AVX2, 2 AVX-512; capped at what
   this CPU has; -1 the best) and return the level now in use. Not to be called while a kernel runs. */
int nac_scan_level(int level) {
    const scan_fn by_level[3] = {scan_plain, scan_avx2, scan_avx512};
    const int best = best_level();
    level = level < 0 || level > best ? best : level;
    scan = by_level[level];
    return level;
}
#else
#define scan scan_plain
int nac_scan_level(int level) { (void)level; return 0; }
#endif

/* Top k of one row s[0..n) into v/ix (sorted). Pass 1 (vectorised) takes the maxima of the G strided groups
   {j : j % G == g} of the first depth * G scores; th0, the smallest of k maxima over disjoint sets of groups,
   is a lower bound of the k-th largest score (k distinct scores reach it), so pass 2 (scan) looks closely only
   at the few scores that reach it. A row with NaN, and the last n % G scores, take the plain scan. */
NAC_CLONES
static void topk_row(const float *s, int64_t n, int64_t k, float *v, int64_t *ix) {
    const int64_t depth = n / G;  /* the first depth * G scores, viewed [depth, G] */
    for (int64_t p = 0; p < k; ++p) { v[p] = -INFINITY; ix[p] = -1; }
    int64_t tail = 0;
    if (depth >= 1 && k <= G / 2) {
        float gm[G];
        int32_t nan[G], any_nan = 0;
        for (int g = 0; g < G; ++g) { gm[g] = s[g]; nan[g] = s[g] != s[g]; }
        for (int64_t d = 1; d < depth; ++d) {
            const float *x = s + d * G;
            for (int g = 0; g < G; ++g) { gm[g] = x[g] > gm[g] ? x[g] : gm[g]; nan[g] |= x[g] != x[g]; }
        }
        for (int g = 0; g < G; ++g) any_nan |= nan[g];
        if (!any_nan) {  /* (a row with NaN takes the plain scan below) */
            float th0 = INFINITY;
            for (int64_t c = 0; c < k; ++c) {
                float m = -INFINITY;
                for (int64_t g = c * G / k; g < (c + 1) * G / k; ++g) m = gm[g] > m ? gm[g] : m;
                th0 = m < th0 ? m : th0;
            }
            scan(s, depth * G, k, th0, v, ix);
            tail = depth * G;
        }
    }
    for (int64_t j = tail; j < n; ++j) consider(s[j], j, k, v, ix);
}

/* Top k (sorted) of every row of scores [rows, n] into values/indices [rows, k]; rows in parallel when built
   with OpenMP (torch's own runtime and thread count, once torch has loaded it) and there is enough work. */
void nac_topk_rows(const float *scores, int64_t rows, int64_t n, int64_t k, float *values, int64_t *indices,
                   int64_t min_parallel) {
    #pragma omp parallel for schedule(static) if (rows * n >= min_parallel)
    for (int64_t r = 0; r < rows; ++r) topk_row(scores + r * n, n, k, values + r * k, indices + r * k);
}

/* ---- fused scores + top-K: the score matrix q . k is never written to memory ---- */

#define SB 64          /* keys per block: a block's SB scores are accumulated in registers */
#define ROWS 16        /* query rows scored together, so each key block is read from L1 ROWS times */
#define GROUP_FLOATS (1 << 16)  /* at most this many buffered scores per thread (256 KB, in L2) */

/* GCC/Clang vector extensions: 16 floats (an AVX-512 register, two AVX2 or four SSE registers); aligned(4):
   loads and stores need no alignment */
typedef float vf16 __attribute__((vector_size(64), aligned(4)));

/* s[t] = sum_c q[c] * kb[c * SB + t], t < SB, c in order 0..d-1: one key block (d x SB, contiguous); the
   SB / 16 partial sums stay in registers */
static inline __attribute__((always_inline)) void score_block(const float *q, const float *kb, int64_t d, float *s) {
    const vf16 *k = (const vf16 *)kb;
    vf16 a0 = q[0] * k[0], a1 = q[0] * k[1], a2 = q[0] * k[2], a3 = q[0] * k[3];
    for (int64_t c = 1; c < d; ++c) {
        const float qc = q[c];
        const vf16 *kc = k + 4 * c;
        a0 += qc * kc[0]; a1 += qc * kc[1]; a2 += qc * kc[2]; a3 += qc * kc[3];
    }
    vf16 *out = (vf16 *)s;
    out[0] = a0; out[1] = a1; out[2] = a2; out[3] = a3;
}

/* The scores of `rows` query rows q [rows, d] against the first n[r] keys (whole blocks) of kb [nb, d, SB]
   into buf [rows, ld]; key block by key block, so a block stays in L1 while every row reads it. */
/* The scores of `rows` query rows q [rows, d] against the first n[r] keys (whole blocks) of kb [nb, d, SB]
   into buf [rows, ld]; key block by key block, so a block stays in L1 while every row reads it. */
/* the same for two query rows at once: each key vector loaded serves both */
static inline __attribute__((always_inline)) void score_block2(const float *q, const float *p, const float *kb,
                                                               int64_t d, float *s, float *o) {
    const vf16 *k = (const vf16 *)kb;
    vf16 a0 = q[0] * k[0], a1 = q[0] * k[1], a2 = q[0] * k[2], a3 = q[0] * k[3];
    vf16 b0 = p[0] * k[0], b1 = p[0] * k[1], b2 = p[0] * k[2], b3 = p[0] * k[3];
    for (int64_t c = 1; c < d; ++c) {
        const float qc = q[c], pc = p[c];
        const vf16 *kc = k + 4 * c;
        a0 += qc * kc[0]; a1 += qc * kc[1]; a2 += qc * kc[2]; a3 += qc * kc[3];
        b0 += pc * kc[0]; b1 += pc * kc[1]; b2 += pc * kc[2]; b3 += pc * kc[3];
    }
    vf16 *out = (vf16 *)s;
    out[0] = a0; out[1] = a1; out[2] = a2; out[3] = a3;
    out = (vf16 *)o;
    out[0] = b0; out[1] = b1; out[2] = b2; out[3] = b3;
}

/* The scores of `rows` query rows q [rows, d] against the first n[r] keys (whole blocks) of kb [nb, d, SB]
   into buf [rows, ld]; key block by key block, so a block stays in L1 while every row reads it. */
NAC_CLONES
static void score_rows(const float *q, const float *kb, int64_t rows, const int64_t *n, int64_t d, int64_t ld,
                       float *buf) {
    int64_t most = 0;
    for (int64_t r = 0; r < rows; ++r) most = n[r] > most ? n[r] : most;
    for (int64_t b = 0; b * SB < most; ++b)
        for (int64_t r = 0; r < rows; ++r)
            if (b * SB < n[r]) score_block(q + r * d, kb + b * d * SB, d, buf + r * ld + b * SB);
}

/* Top k (sorted) of the score rows q[bh, i] . k[bh, j], j < n_i, without the score matrix: q [BH, Tq, d],
   kb [BH, nb, d, SB] (the keys in blocks of SB, each block transposed, zero-padded to nb * SB >= Tk keys),
   lengths [B, Tq] (n_i: query i of sample bh / H sees keys 0..n_i-1, clamped to 0..Tk; NULL: all Tk),
   values/indices [BH, Tq, k]. Each thread scores groups of query rows of one (b, h) into its own buffer
   (L1/L2-resident) and takes each row's top k there (topk_row). Returns 0, or 1 when a buffer could not be
   allocated (then the output is incomplete). */
int nac_scores_topk(const float *q, const float *kb, int64_t BH, int64_t H, int64_t Tq, int64_t Tk, int64_t nb,
                    int64_t d, const int64_t *lengths, int64_t k, float *values, int64_t *indices,
                    int64_t min_parallel) {
    int failed = 0;
    const int64_t ld = nb * SB;
    int64_t per = GROUP_FLOATS / (ld > 0 ? ld : 1);
    per = per < 1 ? 1 : (per > ROWS ? ROWS : per);  /* rows per group */
    const int64_t groups = (Tq + per - 1) / per, tasks = BH * groups;
    #pragma omp parallel if (BH * Tq * Tk >= min_parallel)
    {
        float *buf = (float *)malloc((size_t)(per * ld > 0 ? per * ld : 1) * sizeof(float));
        if (buf == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        /* groups dealt out in turn: causal rows grow with i, so contiguous shares would not balance */
        #pragma omp for schedule(static, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            if (buf == NULL) continue;
            const int64_t bh = task / groups, i0 = (task % groups) * per;
            const int64_t rows = Tq - i0 < per ? Tq - i0 : per;
            int64_t n[ROWS];
            for (int64_t r = 0; r < rows; ++r) {
                int64_t m = lengths == NULL ? Tk : lengths[(bh / H) * Tq + i0 + r];
                n[r] = m < 0 ? 0 : (m > Tk ? Tk : m);
            }
            const int64_t first = bh * Tq + i0;
            score_rows(q + first * d, kb + bh * nb * d * SB, rows, n, d, ld, buf);
            for (int64_t r = 0; r < rows; ++r) {  /* the rest of the last block: -inf, never selected */
                float *row = buf + r * ld;
                const int64_t whole = (n[r] + SB - 1) / SB * SB;
                for (int64_t j = n[r]; j < whole; ++j) row[j] = -INFINITY;
                topk_row(row, whole, k, values + (first + r) * k, indices + (first + r) * k);
            }
        }
        free(buf);
    }
    return failed;
}

/* The pair inputs of the NAC backbone: out[h, f, s*M + i] = keys[h, f, rows[h, s*M + i]], plus
   query[h, f, i] for the first Fq features (one pass instead of torch's gather, then a broadcast add). */
void nac_gather_pairs(const float *keys, const float *query, const int64_t *rows, int64_t H, int64_t F,
                      int64_t Fq, int64_t N, int64_t K, int64_t M, float *out, int64_t min_parallel) {
    const int64_t P = K * M;
    #pragma omp parallel for schedule(static) if (H * F * P >= min_parallel)
    for (int64_t hf = 0; hf < H * F; ++hf) {
        const int64_t h = hf / F, f = hf % F;
        const float *src = keys + hf * N;
        const int64_t *r = rows + h * P;
        float *dst = out + hf * P;
        if (f < Fq) {
            const float *q = query + (h * Fq + f) * M;
            for (int64_t s = 0; s < K; ++s)
                for (int64_t i = 0; i < M; ++i) dst[s * M + i] = src[r[s * M + i]] + q[i];
        } else {
            for (int64_t p = 0; p < P; ++p) dst[p] = src[r[p]];
        }
    }
}
