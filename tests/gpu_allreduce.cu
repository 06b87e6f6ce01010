// The one-shot all-reduce (kernels/allreduce_oneshot.cu) on the GPUs of one node, one MPI rank
// per GPU, on fresh pseudo-random inputs of every rank:
//   1. plain sum and h += sum at 1..256 rows x 7168 and odd sizes (also misaligned buffers), on
//      both wires, against the host computing the same f32 additions in rank order (bit for bit),
//      against NCCL's all-reduce (relative error), and the result identical on every rank;
//   2. the fused h += sum; out = rmsnorm(h) * w against a host RMSNorm in double and against
//      NCCL + k25k_add_rmsnorm, with poisoned outputs and guard rows;
//   3. calls that must not be taken (over the crossover, n % 8 != 0 for the fused variant);
//   4. 1000+ back-to-back calls of every variant and many sizes with the ranks skewed by random
//      delays, inputs made and results checked on the device, to catch call-counter and buffer
//      races;
//   5. the same inside a CUDA graph replayed 100 times.
// Prints one line per check ("ok"/"FAIL") and "N passed, N failed"; exits 1 on any failure.
// With one rank it checks that setup reports "unavailable". --timeout-check (2+ ranks): rank 0
// calls alone and must get the timeout record instead of a hang (the CUDA context of rank 0 is
// lost after it, so it is a separate run).
//
//   mpirun -np 2 gpu_allreduce [--quick] [--timeout-check]
#include <math.h>
#include <nccl.h>
#include <stdarg.h>
#include <string.h>

#include <vector>

#include "cuda_kernels.cuh" // first: gives weights.h C linkage
#include "allreduce_oneshot.cuh"
#include "dist.h"

static k25_dist dist;
static int rank_, nranks_;
static int n_pass, n_fail;

// One result line on rank 0; ok is the AND over the ranks, detail from every failing rank.
static void report(int ok, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, dist.world));
    if (!ok) printf("     rank %d: %s\n", rank_, msg);
    fflush(stdout);
    MPI_CHECK(MPI_Barrier(dist.world));
    if (rank_ == 0) printf("%s %s\n", all ? "ok  " : "FAIL", msg);
    fflush(stdout);
    if (all)
        n_pass++;
    else
        n_fail++;
}

// ------------------------------------------------------------------------------------------
// Inputs: a pure function of (seed, rank, iteration, index), so every rank can compute every
// other rank's input and the device can check results without the host.
// ------------------------------------------------------------------------------------------

__host__ __device__ static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// 24 significant bits times 2^-8..2^8: sums of such values round, so "bit for bit" means
// something.
__host__ __device__ static inline float hval(uint32_t seed, uint32_t rank, uint32_t iter,
                                             uint32_t i) {
    const uint32_t h =
        mix32(i * 0x9e3779b9u ^ mix32(seed * 0x85ebca6bu ^ mix32(rank * 0xc2b2ae35u ^ iter)));
    const uint32_t h2 = mix32(h ^ 0x27d4eb2fu);
    const float m = (float)((int32_t)h >> 8) * (1.0f / 8388608.0f);
    union {
        uint32_t u;
        float f;
    } s;
    s.u = (uint32_t)((int)(h2 % 17u) - 8 + 127) << 23;
    return m * s.f;
}

static float host_wire(float x, int wire) {
    return wire == ONESHOT_WIRE_BF16 ? k25_bf16_to_f32(k25_f32_to_bf16(x)) : x;
}
__device__ static float dev_wire(float x, int wire) {
    return wire == ONESHOT_WIRE_BF16 ? k25_bf16f(k25_f2bf(x)) : x;
}

static const char *wire_name(int wire) {
    return wire == ONESHOT_WIRE_BF16 ? "bf16" : "f32 ";
}

// Which protocols the size checks may use: "auto" (push for small calls, pull above) or "pull".
static int pull_only;
static const char *proto_name(void) {
    return pull_only ? "pull" : "auto";
}

// Same bits on every rank?
static int identical(const void *p, size_t bytes) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    std::vector<uint64_t> all(nranks_);
    MPI_CHECK(MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, dist.world));
    for (int r = 0; r < nranks_; r++)
        if (all[r] != all[0]) return 0;
    return 1;
}

static double rel_err(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        const double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static size_t bits_differ(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += memcmp(a + i, b + i, 4) != 0;
    return k;
}

// ------------------------------------------------------------------------------------------
// Host-checked calls
// ------------------------------------------------------------------------------------------

#define D_MODEL 7168
#define MAX_ROWS 256
#define GUARD 64 // floats of poison around every device buffer
static const size_t CAP = (size_t)(MAX_ROWS + 1) * D_MODEL + 2 * GUARD;

static k25_oneshot *ctx;
static ncclComm_t nccl;
static cudaStream_t st;
static float *dA, *dB, *dC; // device [CAP]
static uint16_t *dW;        // device [W_MAX] (bf16)
static uint16_t *dS;        // device [2 * CAP] (bf16): the fused kernel's hi and lo operands
#define W_MAX 16384         // longest row of the fused checks
static uint32_t seed_ = 1;
static const uint32_t POISON = 0x7fc0deadu;

// Copies ordered on the test's stream and complete on return (a plain cudaMemcpy runs on the
// legacy stream, which a non-blocking stream does not wait for, and may return before a
// pageable host-to-device copy has landed).
static void h2d(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}
static void d2h(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}

static void poison(float *d, size_t n) {
    std::vector<uint32_t> p(n, POISON);
    h2d(d, p.data(), n * 4);
}

static int guards_intact(const float *h, size_t total, size_t begin, size_t end) {
    for (size_t i = 0; i < total; i++) {
        if (i >= begin && i < end) continue;
        uint32_t u;
        memcpy(&u, h + i, 4);
        if (u != POISON) return 0;
    }
    return 1;
}

// buf[n] (at float offset mis from a 16-byte boundary) summed in place; add: h += sum of d.
static void check_flat(int wire, size_t n, size_t mis, int add) {
    const uint32_t seed = seed_++, seed_h = seed_++;
    oneshot_set_wire(ctx, wire);
    const size_t total = n + 2 * GUARD;
    std::vector<float> in(n), h0(n), ref(n), got(total), nc(n);
    for (size_t i = 0; i < n; i++) {
        in[i] = hval(seed, rank_, 0, (uint32_t)i);
        float s = host_wire(hval(seed, 0, 0, (uint32_t)i), wire);
        for (int p = 1; p < nranks_; p++)
            s += host_wire(hval(seed, p, 0, (uint32_t)i), wire);
        h0[i] = hval(seed_h, 0, 0, (uint32_t)i);
        ref[i] = add ? h0[i] + s : s;
    }
    poison(dA, total);
    float *buf = dA + GUARD + mis;
    h2d(add ? dC : buf, in.data(), n * 4);
    if (add) h2d(buf, h0.data(), n * 4);
    const int rc =
        add ? oneshot_allreduce_add(ctx, dC, buf, n, st) : oneshot_allreduce_f32(ctx, buf, n, st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    d2h(got.data(), dA, total * 4);
    const float *res = got.data() + GUARD + mis;
    const size_t wrong = bits_differ(res, ref.data(), n);
    const int guards = guards_intact(got.data(), total, GUARD + mis, GUARD + mis + n);
    // NCCL on the same inputs (f32)
    h2d(dB, in.data(), n * 4);
    NCCL_CHECK(ncclAllReduce(dB, dB, n, ncclFloat32, ncclSum, nccl, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    d2h(nc.data(), dB, n * 4);
    if (add)
        for (size_t i = 0; i < n; i++)
            nc[i] += h0[i];
    const double e_nccl = rel_err(res, nc.data(), n);
    const double tol = wire == ONESHOT_WIRE_BF16 ? 1e-2 : 1e-6;
    const int same = identical(res, n * 4);
    report(rc == 0 && wrong == 0 && guards && e_nccl <= tol && same,
           "%s %s wire %s n=%zu (%zu x %d + %zu)%s: rc %d, %zu wrong bits vs host, rel %.1e vs "
           "NCCL, guards %s, %s on %d ranks",
           add ? "add" : "sum", wire_name(wire), proto_name(), n, n / D_MODEL, D_MODEL, n % D_MODEL,
           mis ? " misaligned" : "", rc, wrong, e_nccl, guards ? "intact" : "WRITTEN",
           same ? "identical" : "DIFFERENT", nranks_);
}

// h, d, out at float offset mis from a 16-byte boundary (mis > 0: the kernel's scalar path).
static void check_fused(int wire, int T, int n, size_t mis) {
    const uint32_t seed = seed_++, seed_h = seed_++, seed_w = seed_++;
    oneshot_set_wire(ctx, wire);
    const float eps = 1e-6f;
    const size_t tn = (size_t)T * n, total = mis + tn + n; // a guard row after the T rows
    std::vector<float> d(tn), h0(tn), href(tn), oref(tn), hgot(total), ogot(total), h2(tn), o2(tn);
    std::vector<uint16_t> w(n);
    for (int i = 0; i < n; i++)
        w[i] = k25_f32_to_bf16(0.5f + 0.5f * fabsf(hval(seed_w, 0, 0, i)));
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < n; i++) {
            const size_t k = (size_t)t * n + i;
            d[k] = hval(seed, rank_, 0, (uint32_t)k);
            float s = host_wire(hval(seed, 0, 0, (uint32_t)k), wire);
            for (int p = 1; p < nranks_; p++)
                s += host_wire(hval(seed, p, 0, (uint32_t)k), wire);
            h0[k] = hval(seed_h, 0, 0, (uint32_t)k);
            href[k] = h0[k] + s;
            ss += (double)href[k] * href[k];
        }
        const double r = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++) {
            const size_t k = (size_t)t * n + i;
            oref[k] = (float)(href[k] * r * k25_bf16_to_f32(w[i]));
        }
    }
    h2d(dW, w.data(), n * 2);
    h2d(dC + mis, d.data(), tn * 4);
    poison(dA, total);
    poison(dB, total);
    h2d(dA + mis, h0.data(), tn * 4);
    CUDA_CHECK(cudaMemset(dS, 0xff, 2 * CAP * 2));
    const int rc = oneshot_allreduce_add_rmsnorm(ctx, dC + mis, dA + mis, dW, eps, T, n, dB + mis,
                                                 dS + mis, dS + CAP + mis, st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    d2h(hgot.data(), dA, total * 4);
    d2h(ogot.data(), dB, total * 4);
    const float *hg = hgot.data() + mis, *og = ogot.data() + mis;
    // the bf16 operands written beside out: hi = bf16(out), lo = bf16(out - hi), by the host
    std::vector<uint16_t> sgot(2 * CAP);
    CUDA_CHECK(cudaMemcpy(sgot.data(), dS, 2 * CAP * 2, cudaMemcpyDeviceToHost));
    size_t wrong_s = 0;
    for (size_t k = 0; k < tn; k++) {
        const uint16_t hi = k25_f32_to_bf16(og[k]);
        wrong_s += sgot[mis + k] != hi;
        wrong_s += sgot[CAP + mis + k] != k25_f32_to_bf16(og[k] - k25_bf16_to_f32(hi));
    }
    const size_t wrong_h = bits_differ(hg, href.data(), tn);
    size_t wrong_o = 0;
    double max_ref = 0;
    for (size_t k = 0; k < tn; k++)
        max_ref = fmax(max_ref, fabs(oref[k]));
    for (size_t k = 0; k < tn; k++)
        if (!(fabs((double)og[k] - oref[k]) <= 1e-5 * fabs(oref[k]) + 1e-7 * max_ref)) wrong_o++;
    const double e_host = rel_err(og, oref.data(), tn);
    const int guards = guards_intact(hgot.data(), total, mis, mis + tn) &&
                       guards_intact(ogot.data(), total, mis, mis + tn);
    // NCCL + the backend's add_rmsnorm on the same inputs (h0 again in dA's place: use dC, dB)
    float *dh = dA, *dd = dC, *dout = dB;
    h2d(dh, h0.data(), tn * 4);
    h2d(dd, d.data(), tn * 4);
    NCCL_CHECK(ncclAllReduce(dd, dd, tn, ncclFloat32, ncclSum, nccl, st));
    k25k_add_rmsnorm(dh, dd, dW, eps, T, n, dout, nullptr, nullptr, st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    d2h(h2.data(), dh, tn * 4);
    d2h(o2.data(), dout, tn * 4);
    const double e_nccl = rel_err(og, o2.data(), tn);
    const double tol = wire == ONESHOT_WIRE_BF16 ? 1e-2 : 1e-5;
    const int same = identical(hg, tn * 4) && identical(og, tn * 4);
    report(rc == 0 && wrong_h == 0 && wrong_o == 0 && e_host <= 1e-5 && e_nccl <= tol && guards &&
               same && wrong_s == 0,
           "fused %s wire %s T=%d n=%d%s: rc %d, h %zu wrong bits, out rel %.1e vs host (%zu "
           "beyond 1e-5), rel %.1e vs NCCL+add_rmsnorm, bf16 hi/lo %zu wrong, guards %s, %s on "
           "%d ranks",
           wire_name(wire), proto_name(), T, n, mis ? " misaligned" : "", rc, wrong_h, e_host,
           wrong_o, e_nccl, wrong_s, guards ? "intact" : "WRITTEN",
           same ? "identical" : "DIFFERENT", nranks_);
}

// Calls the context must refuse (return 1, touch nothing), the same on every rank.
static void check_not_taken(void) {
    oneshot_set_wire(ctx, ONESHOT_WIRE_F32);
    const size_t lim = oneshot_limit(ctx);
    const size_t n_over = lim / 4 + 8;
    int ok = 1;
    poison(dA, 64);
    if (n_over <= CAP) ok &= oneshot_allreduce_f32(ctx, dA, n_over, st) == 1;
    ok &= oneshot_allreduce_add(ctx, dB, dA, n_over, st) == 1;
    uint16_t *no = nullptr; // no bf16 operands
    ok &= oneshot_allreduce_add_rmsnorm(ctx, dB, dA, dW, 1e-6f, 2, 12, dC, no, no, st) == 1; // n%8
    ok &= oneshot_allreduce_add_rmsnorm(ctx, dB, dA, dW, 1e-6f, (int)(lim / (4 * 64)) + 1, 64, dC,
                                        no, no, st) == 1;
    oneshot_set_limit(ctx, 4 * D_MODEL);
    ok &= oneshot_allreduce_f32(ctx, dA, 2 * D_MODEL, st) == 1;
    ok &= oneshot_allreduce_add_rmsnorm(ctx, dB, dA, dW, 1e-6f, 2, D_MODEL, dC, no, no, st) == 1;
    oneshot_set_limit(ctx, lim);
    ok &= oneshot_allreduce_f32(ctx, dA, 0, st) == 0 &&
          oneshot_allreduce_add_rmsnorm(ctx, dB, dA, dW, 1e-6f, 0, 64, dC, no, no, st) == 0;
    CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<float> g(64);
    d2h(g.data(), dA, 64 * 4);
    ok &= guards_intact(g.data(), 64, 0, 0);
    report(ok,
           "calls over the crossover (%zu bytes), over a lowered one, n %% 8 != 0 and empty "
           "calls are refused or no-ops, buffers untouched",
           lim);
}

// ------------------------------------------------------------------------------------------
// Device-checked back-to-back calls
// ------------------------------------------------------------------------------------------

struct dev_check {
    unsigned long long bad, xsum;
};

__global__ void gen_kernel(float *x, size_t n, uint32_t seed, uint32_t rank, const uint32_t *iter) {
    const uint32_t it = *iter;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = hval(seed, rank, it, (uint32_t)i);
}

// Spins for table[(iter * 7 + slot) % 64] ns: skews the ranks' arrival at the next call.
__global__ void skew_kernel(const uint32_t *iter, const uint32_t *table, int slot) {
    const uint32_t ns = table[(*iter * 7u + (uint32_t)slot) % 64u];
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

__global__ void bump_kernel(uint32_t *iter) {
    *iter += 1u;
}

__device__ static void note(dev_check *c, unsigned long long bad, unsigned long long xs) {
    if (bad) atomicAdd(&c->bad, bad);
    if (xs) atomicXor(&c->xsum, xs);
}

__device__ static unsigned long long tag(size_t i, float v, uint32_t it) {
    return ((unsigned long long)mix32((uint32_t)i * 2654435761u ^ it) << 32) ^ __float_as_uint(v);
}

// got[n] == sum_p wire(hval(seed, p, it, i)) (+ hval(seed_h, 0, it, i) when add), bit for bit.
__global__ void verify_flat_kernel(const float *got, size_t n, uint32_t seed, uint32_t seed_h,
                                   int add, int nranks, int wire, const uint32_t *iter,
                                   dev_check *c) {
    const uint32_t it = *iter;
    unsigned long long bad = 0, xs = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = dev_wire(hval(seed, 0, it, (uint32_t)i), wire);
        for (int p = 1; p < nranks; p++)
            s += dev_wire(hval(seed, p, it, (uint32_t)i), wire);
        const float want = add ? hval(seed_h, 0, it, (uint32_t)i) + s : s;
        bad += __float_as_uint(got[i]) != __float_as_uint(want);
        xs ^= tag(i, got[i], it);
    }
    note(c, bad, xs);
}

// One block per row: h exact, out within 1e-5 of rmsnorm computed in double.
__global__ void verify_fused_kernel(const float *h, const float *out, const uint16_t *w, int n,
                                    float eps, uint32_t seed, uint32_t seed_h, int nranks, int wire,
                                    const uint32_t *iter, dev_check *c) {
    __shared__ double part[256];
    const uint32_t it = *iter;
    const size_t r = blockIdx.x;
    unsigned long long bad = 0, xs = 0;
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const uint32_t k = (uint32_t)(r * n + i);
        float s = dev_wire(hval(seed, 0, it, k), wire);
        for (int p = 1; p < nranks; p++)
            s += dev_wire(hval(seed, p, it, k), wire);
        const float want = hval(seed_h, 0, it, k) + s;
        bad += __float_as_uint(h[r * n + i]) != __float_as_uint(want);
        ss += (double)want * want;
    }
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    const double rinv = 1.0 / sqrt(part[0] / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const double want = (double)h[r * n + i] * rinv * k25_bf16f(w[i]);
        const float g = out[r * n + i];
        bad += !(fabs((double)g - want) <= 1e-5 * fabs(want) + 1e-30);
        xs ^= tag(r * n + i, g, it) ^ tag(i, h[r * n + i], ~it);
    }
    note(c, bad, xs);
}

struct stress_op {
    int kind; // 0 sum, 1 add, 2 fused
    int wire;
    size_t n; // values (sum, add) or row length (fused)
    int T;    // rows (fused)
};

// Enqueues one round of ops (no host synchronization: capturable). Seeds differ per op slot.
static void enqueue_round(const std::vector<stress_op> &ops, uint32_t *iter, const uint32_t *table,
                          dev_check *chk) {
    const float eps = 1e-6f;
    for (size_t k = 0; k < ops.size(); k++) {
        const stress_op &o = ops[k];
        const uint32_t seed = 1000 + 3 * (uint32_t)k, seed_h = seed + 1;
        const size_t vals = o.kind == 2 ? (size_t)o.T * o.n : o.n;
        const int g = (int)std::min<size_t>(1024, (vals + 255) / 256);
        oneshot_set_wire(ctx, o.wire);
        skew_kernel<<<1, 1, 0, st>>>(iter, table, (int)k);
        gen_kernel<<<g, 256, 0, st>>>(o.kind == 0 ? dA : dC, vals, seed, rank_, iter);
        if (o.kind) gen_kernel<<<g, 256, 0, st>>>(dA, vals, seed_h, 0, iter);
        K25_LAUNCH_CHECK(st, "stress inputs");
        int rc;
        if (o.kind == 0)
            rc = oneshot_allreduce_f32(ctx, dA, vals, st);
        else if (o.kind == 1)
            rc = oneshot_allreduce_add(ctx, dC, dA, vals, st);
        else
            rc = oneshot_allreduce_add_rmsnorm(ctx, dC, dA, dW, eps, o.T, (int)o.n, dB, nullptr,
                                               nullptr, st);
        if (rc) K25_DIE("stress op %zu (kind %d, %zu values) not taken", k, o.kind, vals);
        if (o.kind < 2)
            verify_flat_kernel<<<g, 256, 0, st>>>(dA, vals, seed, seed_h, o.kind, nranks_, o.wire,
                                                  iter, chk);
        else
            verify_fused_kernel<<<o.T, 256, 0, st>>>(dA, dB, dW, (int)o.n, eps, seed, seed_h,
                                                     nranks_, o.wire, iter, chk);
        K25_LAUNCH_CHECK(st, "stress verify");
    }
    bump_kernel<<<1, 1, 0, st>>>(iter);
    K25_LAUNCH_CHECK(st, "stress bump");
}

static void check_stress(int rounds, int graph) {
    std::vector<stress_op> ops = {
        {2, ONESHOT_WIRE_F32, D_MODEL, 1},       {0, ONESHOT_WIRE_F32, D_MODEL, 0},
        {2, ONESHOT_WIRE_BF16, D_MODEL, 3},      {1, ONESHOT_WIRE_F32, 2 * D_MODEL + 5, 0},
        {0, ONESHOT_WIRE_BF16, 1001, 0},         {2, ONESHOT_WIRE_F32, D_MODEL, 33},
        {0, ONESHOT_WIRE_F32, 64 * D_MODEL, 0},  {2, ONESHOT_WIRE_F32, D_MODEL, 256},
        {1, ONESHOT_WIRE_BF16, 17 * D_MODEL, 0}, {0, ONESHOT_WIRE_F32, 256 * D_MODEL, 0},
    };
    uint32_t *iter, *table;
    dev_check *chk;
    CUDA_CHECK(cudaMalloc(&iter, 4));
    CUDA_CHECK(cudaMalloc(&table, 64 * 4));
    CUDA_CHECK(cudaMalloc(&chk, sizeof(dev_check)));
    CUDA_CHECK(cudaMemsetAsync(iter, 0, 4, st));
    CUDA_CHECK(cudaMemsetAsync(chk, 0, sizeof(dev_check), st));
    uint32_t tab[64];
    for (int i = 0; i < 64; i++) {
        const uint32_t h = mix32(0xabcdu + 977u * rank_ + 31u * i + 7u * graph);
        tab[i] = h % 8 == 0 ? 0u : h % 20000u; // 0..20 us, often none
    }
    h2d(table, tab, sizeof tab);
    std::vector<uint16_t> w(D_MODEL);
    for (int i = 0; i < D_MODEL; i++)
        w[i] = k25_f32_to_bf16(0.75f + 0.25f * hval(77, 0, 0, i));
    h2d(dW, w.data(), D_MODEL * 2);
    MPI_CHECK(MPI_Barrier(dist.world));
    cudaGraphExec_t exec = NULL;
    if (graph) {
        cudaGraph_t g;
        CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        enqueue_round(ops, iter, table, chk);
        CUDA_CHECK(cudaStreamEndCapture(st, &g));
        CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
        CUDA_CHECK(cudaGraphDestroy(g));
    }
    for (int r = 0; r < rounds; r++) {
        if (graph)
            CUDA_CHECK(cudaGraphLaunch(exec, st));
        else
            enqueue_round(ops, iter, table, chk);
    }
    CUDA_CHECK(cudaStreamSynchronize(st));
    dev_check h;
    d2h(&h, chk, sizeof h);
    const int same = identical(&h.xsum, sizeof h.xsum);
    report(h.bad == 0 && same,
           "%s: %d rounds x %zu calls (sum/add/fused, both wires, 1001 values to 256 rows, ranks "
           "skewed by up to 20 us): %llu wrong values, results %s on %d ranks",
           graph ? "CUDA graph replayed" : "back-to-back", rounds, ops.size(), h.bad,
           same ? "identical" : "DIFFERENT", nranks_);
    if (exec) CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaFree(iter));
    CUDA_CHECK(cudaFree(table));
    CUDA_CHECK(cudaFree(chk));
}

// ------------------------------------------------------------------------------------------
// Main
// ------------------------------------------------------------------------------------------

static int finish(void) {
    if (rank_ == 0) printf("%d passed, %d failed\n", n_pass, n_fail);
    fflush(stdout);
    dist_finalize(&dist);
    return n_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    dist_init(&dist, &argc, &argv);
    rank_ = dist.world_rank, nranks_ = dist.world_size;
    int quick = 0, timeout_check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--timeout-check"))
            timeout_check = 1;
        else
            K25_DIE(
                "usage: mpirun -np N gpu_allreduce [--quick] [--timeout-check] (bad argument %s)",
                argv[i]);
    }
    int ndev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ndev));
    K25_CHECK(ndev > 0, "no CUDA device");
    CUDA_CHECK(cudaSetDevice(dist.local_rank % ndev));
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    char err[K25_ERR_LEN];
    ctx = oneshot_create(dist.world, ((size_t)MAX_ROWS * D_MODEL + 64) * 4, err);
    if (nranks_ == 1) {
        report(ctx == NULL && strstr(err, "ranks"), "one rank: setup reports unavailable (%s)",
               err);
        return finish();
    }
    if (!ctx) {
        report(0, "setup: %s", err);
        return finish();
    }
    oneshot_set_limit(ctx, SIZE_MAX); // every size the buffers hold, whatever the crossover
    char desc[512];
    oneshot_describe(ctx, desc, sizeof desc);
    if (rank_ == 0) printf("# %s\n", desc);

    if (timeout_check) {
        // rank 0 calls alone: its blocks must give up after 1 s and leave the record
        oneshot_set_timeout(ctx, 1.0);
        int ok = 1;
        char msg[K25_ERR_LEN] = "";
        if (rank_ == 0) {
            float *b;
            CUDA_CHECK(cudaMalloc(&b, D_MODEL * 4));
            oneshot_allreduce_f32(ctx, b, D_MODEL, st);
            const cudaError_t e = cudaStreamSynchronize(st);
            ok = e != cudaSuccess && oneshot_check(ctx, msg);
        }
        report(ok, "a rank calling alone times out instead of hanging: %s", rank_ == 0 ? msg : "");
        return finish(); // rank 0's context is lost: no teardown
    }

    ncclUniqueId id;
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, dist.world));
    NCCL_CHECK(ncclCommInitRank(&nccl, nranks_, id, rank_));
    CUDA_CHECK(cudaMalloc(&dA, CAP * 4));
    CUDA_CHECK(cudaMalloc(&dB, CAP * 4));
    CUDA_CHECK(cudaMalloc(&dC, CAP * 4));
    CUDA_CHECK(cudaMalloc(&dW, W_MAX * 2));
    CUDA_CHECK(cudaMalloc(&dS, 2 * CAP * 2));

    const int rows_full[] = {1,  2,  3,  4,  5,  7,   8,   9,   15,  16,  17,  31,
                             32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256};
    const int rows_quick[] = {1, 3, 16, 33, 256};
    const int *rows = quick ? rows_quick : rows_full;
    const int n_rows = quick ? 5 : (int)(sizeof rows_full / sizeof rows_full[0]);
    const size_t odd[] = {1, 2, 3, 5, 7, 8, 9, 15, 17, 1000, 7167, 7169, 12345, 65537, 1000003};
    const int fused_n[] = {8, 64, 1000, 4104, 7168, 16384};
    for (int pass = 0; pass < 4; pass++) {
        const int wire = pass & 1;
        pull_only = pass >> 1;
        oneshot_tune(ctx, 0, 0, pull_only ? 0 : 1L << 30);
        if (pull_only && quick) continue;
        for (int i = 0; i < n_rows; i++)
            check_flat(wire, (size_t)rows[i] * D_MODEL, 0, 0);
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
            if (!quick || i % 4 == 0) check_flat(wire, odd[i], 0, 0);
        for (int mis = 1; mis < 4; mis++)
            check_flat(wire, 3 * D_MODEL + mis, (size_t)mis, 0);
        for (int i = 0; i < n_rows; i += 2)
            check_flat(wire, (size_t)rows[i] * D_MODEL + (i % 3), 0, 1);
        check_flat(wire, 1001, 1, 1);
        for (int i = 0; i < n_rows; i++)
            check_fused(wire, rows[i], D_MODEL, 0);
        for (size_t i = 0; i < sizeof fused_n / sizeof fused_n[0]; i++)
            check_fused(wire, 1 + (int)i * 5, fused_n[i], 0);
        check_fused(wire, 5, D_MODEL, 1);
        check_fused(wire, 2, 64, 3);
    }
    oneshot_tune(ctx, 0, 0, 1L << 30);
    pull_only = 0;
    check_not_taken();
    check_stress(quick ? 30 : 105, 0);
    check_stress(quick ? 10 : 100, 1);

    oneshot_destroy(ctx);
    ncclCommDestroy(nccl);
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    CUDA_CHECK(cudaFree(dC));
    CUDA_CHECK(cudaFree(dW));
    CUDA_CHECK(cudaFree(dS));
    return finish();
}
