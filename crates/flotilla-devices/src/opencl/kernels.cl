// Flotilla's OpenCL kernels: column-major BLAS-like operations.
// Built twice per device: with -DUSE_FP64 (real = double) and without (real = float).
// Sizes are int (the host checks they fit); offsets are computed in long.

#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double real;
#else
typedef float real;
#endif

#define TS 16

// The inputs of a mixed-precision product (float programs only): x rounded to nearest,
// ties to even, keeping `keep` explicit significand bits (10 = TF32, 7 = bf16, 23 = x).
// Infinities and NaNs pass unchanged; must match MathMode::round on the host.
#ifndef USE_FP64
inline float round_in(const float x, const int keep) {
    if (keep >= 23 || isinf(x) || isnan(x)) return x;
    const int drop = 23 - keep;
    const uint u = as_uint(x);
    const uint lsb = (u >> drop) & 1u;
    const uint halfway = 1u << (drop - 1);
    return as_float((u + (halfway - 1u + lsb)) & ~((1u << drop) - 1u));
}
#define ROUND_IN(x) round_in((x), keep)
#else
#define ROUND_IN(x) (x)
#endif

// C := alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n, C m x n.
// tri = 0: whole C; 1: only the lower triangle (i >= j); 2: only the upper one (i <= j).
// beta == 0: C is not read. Work-groups of TS x TS, dimension 0 along the rows of C.
// keep: significand bits the inputs are rounded to (float only; 23 = not rounded).
__kernel __attribute__((reqd_work_group_size(TS, TS, 1)))
void gemm(const int ta, const int tb, const int m, const int n, const int k,
          const real alpha, __global const real* A, const int lda,
          __global const real* B, const int ldb, const real beta,
          __global real* C, const int ldc, const int tri, const int keep)
{
    const int li = get_local_id(0);
    const int lj = get_local_id(1);
    const int i = get_group_id(0) * TS + li;
    const int j = get_group_id(1) * TS + lj;
    __local real As[TS][TS + 1]; // As[p][i] = op(A)[i, p0 + p]
    __local real Bs[TS][TS + 1]; // Bs[j][p] = op(B)[p0 + p, j]
    real acc = 0;
    for (int p0 = 0; p0 < k; p0 += TS) {
        const int p = p0 + lj;
        real av = 0;
        if (i < m && p < k) {
            av = ROUND_IN(ta ? A[p + (long)i * lda] : A[i + (long)p * lda]);
        }
        As[lj][li] = av;
        const int q = p0 + li;
        real bv = 0;
        if (q < k && j < n) {
            bv = ROUND_IN(tb ? B[j + (long)q * ldb] : B[q + (long)j * ldb]);
        }
        Bs[lj][li] = bv;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int t = 0; t < TS; ++t) {
            acc += As[t][li] * Bs[lj][t];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (i >= m || j >= n) return;
    if (tri == 1 && i < j) return;
    if (tri == 2 && i > j) return;
    const long idx = i + (long)j * ldc;
    C[idx] = (beta == 0) ? alpha * acc : alpha * acc + beta * C[idx];
}

// For each of nvec right-hand sides x (element r at x[r * inc], vector v at B + v * vinc),
// solves T x := alpha x, where T is the n x n triangular matrix
// T(r, c) = ta ? A[c + r * lda] : A[r + c * lda] (lower or upper, unit diagonal or not).
// One work-item per right-hand side.
#define T_AT(r, c) (ta ? A[(c) + (long)(r) * lda] : A[(r) + (long)(c) * lda])
__kernel void trsm(const int n, const int nvec, const real alpha,
                   __global const real* A, const int lda, const int ta,
                   const int lower, const int unit,
                   __global real* B, const int inc, const int vinc)
{
    const int v = get_global_id(0);
    if (v >= nvec) return;
    __global real* x = B + (long)v * vinc;
    if (alpha == 0) {
        for (int r = 0; r < n; ++r) x[(long)r * inc] = 0;
        return;
    }
    if (lower) {
        for (int r = 0; r < n; ++r) {
            real s = alpha * x[(long)r * inc];
            for (int c = 0; c < r; ++c) s -= T_AT(r, c) * x[(long)c * inc];
            x[(long)r * inc] = unit ? s : s / T_AT(r, r);
        }
    } else {
        for (int r = n - 1; r >= 0; --r) {
            real s = alpha * x[(long)r * inc];
            for (int c = r + 1; c < n; ++c) s -= T_AT(r, c) * x[(long)c * inc];
            x[(long)r * inc] = unit ? s : s / T_AT(r, r);
        }
    }
}

// Cholesky in place, one work-group. Works on the lower-triangle view L(i, p): the matrix
// itself (upper == 0) or its transpose (upper == 1, so A = U^T U with U = L^T).
// Left-looking, column by column: work-item 0 computes the pivot, all work-items the column
// below it. info[0] = 0 on success, else the 1-based column of the first non-positive pivot.
#define L_AT(i, p) A[upper ? ((p) + (long)(i) * lda) : ((i) + (long)(p) * lda)]
__kernel void potrf(const int n, __global real* A, const int lda, const int upper,
                    __global int* info)
{
    const int lid = get_local_id(0);
    const int ls = get_local_size(0);
    __local real diag;
    __local int failed;
    if (lid == 0) failed = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = 0; j < n; ++j) {
        if (lid == 0) {
            real d = L_AT(j, j);
            for (int p = 0; p < j; ++p) {
                const real l = L_AT(j, p);
                d -= l * l;
            }
            if (!(d > 0)) {
                failed = j + 1;
            } else {
                d = sqrt(d);
                L_AT(j, j) = d;
                diag = d;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (failed) break;
        const real dj = diag;
        for (int i = j + 1 + lid; i < n; i += ls) {
            real s = L_AT(i, j);
            for (int p = 0; p < j; ++p) s -= L_AT(i, p) * L_AT(j, p);
            L_AT(i, j) = s / dj;
        }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }
    if (lid == 0) info[0] = failed;
}
