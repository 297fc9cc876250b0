/*
 * sampler.c - choosing the next token from logits (see sampler.h).
 *
 * One call runs, in this order:
 *
 *  1. repetition penalty: each distinct token among the last repeat_last_n
 *     of history is penalised once (positive logit / penalty, zero or
 *     negative logit * penalty, as llama.cpp's penalties sampler does);
 *  2. cleaning: NaN becomes -inf (never chosen); if any logit is +inf,
 *     the +inf tokens share all the probability equally and every other
 *     token gets none (instead of the softmax computing inf - inf = NaN);
 *  3. temperature <= 0: argmax, lowest index on ties, and stop;
 *  4. top-k, temperature, softmax, top-p, min-p, renormalise, draw.
 *
 * When every logit is -inf or NaN there is nothing to choose from and the
 * sampler returns token 0, on both paths, so the result is always a valid
 * token id.
 *
 * No step sorts the whole vocabulary. Candidates live in scratch allocated
 * at create time. Top-k keeps a k-entry min-heap while scanning the logits
 * (O(V + k log k) in practice, O(V log k) at worst). Min-p needs no order
 * and runs before top-p (see below), which usually leaves top-p a handful
 * of tokens; top-p orders small sets with a max-heap, popping only the
 * tokens it keeps, and first narrows large ones with weight buckets, so
 * only the tokens near its cut are ordered: typically O(V), O(V log V) at
 * worst (every logit equal).
 *
 * Randomness: xoshiro256** (Blackman and Vigna), its 256-bit state filled
 * from the seed by splitmix64. Both use only 64-bit integer arithmetic, so
 * the random stream for a seed is the same on every platform. Each sampled
 * (non-greedy) call consumes exactly one 64-bit output, whatever the
 * filters keep, so the stream position depends only on the number of calls.
 * The token drawn also depends on expf; libm implementations agree to
 * within an ulp or so, which can change a draw only when it lands within
 * that distance of the boundary between two tokens' shares.
 */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* One candidate token. w is exp((logit - max) / temperature), the
 * unnormalised probability, filled once temperature has been applied. */
typedef struct cand {
    float logit;
    float w;
    int32_t id;
} cand;

/* Top-p orders sets up to this size with a heap; larger ones are first
 * cut down by weight buckets (top_p_bucketed). */
#define TOP_P_HEAP_MAX 2048
#define TOP_P_BUCKETS 1024

struct bn_sampler {
    bn_sampler_params p;
    int32_t vocab;
    uint64_t rng[4];  /* xoshiro256** state                            */
    cand *cands;      /* vocab entries: the candidate working set      */
    uint8_t *seen;    /* vocab flags: token already penalised this call */
    double bucket_mass[TOP_P_BUCKETS]; /* top_p_bucketed's scratch     */
};

/* ------------------------------------------------------------------------ */
/* Random numbers                                                            */
/* ------------------------------------------------------------------------ */

/* splitmix64: turns a counter into well-mixed 64-bit values; used only to
 * expand the user's seed into xoshiro's state. That state must not be all
 * zero, and cannot be: splitmix64 is a bijection of its counter, so of
 * four consecutive outputs at most one is zero. */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void rng_seed(uint64_t st[4], uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        st[i] = splitmix64(&x);
}

static uint64_t rng_next(uint64_t st[4])
{
    const uint64_t out = rotl64(st[1] * 5, 7) * 9;
    const uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl64(st[3], 45);
    return out;
}

/* Uniform double in [0, 1): the top 53 bits, exactly representable. */
static double rng_uniform(uint64_t st[4]) { return (double)(rng_next(st) >> 11) * 0x1.0p-53; }

/* ------------------------------------------------------------------------ */
/* Parameters, creation                                                      */
/* ------------------------------------------------------------------------ */

void bn_sampler_params_default(bn_sampler_params *p)
{
    if (!p)
        return;
    /* Greedy with every filter and the penalty off, so that a caller who
     * only raises the temperature gets the plain softmax distribution. */
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64; /* llama.cpp's window; inert while the penalty is 1 */
    p->seed = 0;
}

bn_status bn_sampler_create(const bn_sampler_params *p, int32_t vocab_size, bn_sampler **out,
                            bn_error *err)
{
    if (out)
        *out = NULL;
    if (!p || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_sampler_create: params and out must not be NULL");
    if (vocab_size < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "pass the model's vocabulary size",
                            "sampler vocabulary size %d must be at least 1", (int)vocab_size);
    /* NaN would make every comparison below false and silently disable a
     * filter; +inf temperature turns (logit - max) / T into NaN. */
    if (isnan(p->temperature) || p->temperature == INFINITY)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use a finite temperature (<= 0: greedy)",
                            "sampler temperature %g is not finite", (double)p->temperature);
    if (isnan(p->top_p))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use a value in (0, 1], 1 = off",
                            "sampler top_p is NaN");
    if (isnan(p->min_p))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use a value in [0, 1], 0 = off",
                            "sampler min_p is NaN");
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use a finite penalty > 0 (1 = off, 1.1 is typical)",
                            "sampler repeat_penalty %g must be finite and positive",
                            (double)p->repeat_penalty);
    if ((uint64_t)vocab_size > SIZE_MAX / sizeof(cand))
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "sampler scratch for %d tokens does not fit in memory",
                            (int)vocab_size);

    bn_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "cannot allocate the sampler");
    s->p = *p;
    s->vocab = vocab_size;
    s->cands = malloc((size_t)vocab_size * sizeof *s->cands);
    s->seen = calloc((size_t)vocab_size, 1);
    if (!s->cands || !s->seen) {
        bn_sampler_free(s);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "cannot allocate sampler scratch for %d tokens", (int)vocab_size);
    }
    rng_seed(s->rng, p->seed);
    *out = s;
    return BN_OK;
}

void bn_sampler_free(bn_sampler *s)
{
    if (!s)
        return;
    free(s->cands);
    free(s->seen);
    free(s);
}

void bn_sampler_reset(bn_sampler *s, uint64_t seed)
{
    if (!s)
        return;
    s->p.seed = seed;
    rng_seed(s->rng, seed);
}

double bn_sampler_next_uniform(const bn_sampler *s) { return bn_sampler_uniform_ahead(s, 0); }

double bn_sampler_uniform_ahead(const bn_sampler *s, int ahead)
{
    if (!s)
        return 0.0;
    uint64_t copy[4];
    memcpy(copy, s->rng, sizeof copy);
    for (int i = 0; i < ahead; i++)
        (void)rng_uniform(copy);
    return rng_uniform(copy);
}

void bn_sampler_skip(bn_sampler *s)
{
    if (s)
        (void)rng_uniform(s->rng);
}

/* ------------------------------------------------------------------------ */
/* Steps                                                                     */
/* ------------------------------------------------------------------------ */

static void apply_repeat_penalty(bn_sampler *s, float *logits, const int32_t *history,
                                 size_t n_history)
{
    const float pen = s->p.repeat_penalty;
    if (pen == 1.0f || s->p.repeat_last_n == 0 || !history || n_history == 0)
        return;
    /* Negative repeat_last_n: the whole history (llama.cpp's -1). */
    size_t n = n_history;
    if (s->p.repeat_last_n > 0 && (size_t)s->p.repeat_last_n < n)
        n = (size_t)s->p.repeat_last_n;
    const int32_t *win = history + (n_history - n);

    /* A token repeated in the window is still penalised once: mark it the
     * first time, then clear exactly the marks set, so the cost is O(n)
     * and not O(vocab). Ids outside the vocabulary are ignored. */
    for (size_t i = 0; i < n; i++) {
        const int32_t t = win[i];
        if (t < 0 || t >= s->vocab || s->seen[t])
            continue;
        s->seen[t] = 1;
        const float l = logits[t];
        float v = l <= 0.0f ? l * pen : l / pen;
        /* A finite logit stays finite: overflowing to -inf would make the
         * token look masked, to +inf would give it all the probability. */
        if (isfinite(l) && !isfinite(v))
            v = l > 0.0f ? FLT_MAX : -FLT_MAX;
        logits[t] = v;
    }
    for (size_t i = 0; i < n; i++) {
        const int32_t t = win[i];
        if (t >= 0 && t < s->vocab)
            s->seen[t] = 0;
    }
}

/* Order of preference: higher logit first, lower id on ties. A total
 * order, so every selection below has exactly one answer. */
static bool better(const cand *a, const cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static bool worse(const cand *a, const cand *b) { return better(b, a); }

typedef bool (*cand_order)(const cand *, const cand *);

/* Binary heap over c[0..n) with above(parent, child) for every edge: a
 * max-heap (best on top) with `better`, a min-heap with `worse`. */
static void sift_down(cand *c, size_t n, size_t i, cand_order above)
{
    for (;;) {
        size_t top = i;
        const size_t l = 2 * i + 1, r = l + 1;
        if (l < n && above(&c[l], &c[top]))
            top = l;
        if (r < n && above(&c[r], &c[top]))
            top = r;
        if (top == i)
            return;
        const cand t = c[i];
        c[i] = c[top];
        c[top] = t;
        i = top;
    }
}

static void heapify(cand *c, size_t n, cand_order above)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(c, n, i, above);
}

/* Moves the top of the heap c[0..n) to c[n-1]; c[0..n-1) stays a heap. */
static void heap_pop(cand *c, size_t n, cand_order above)
{
    const cand t = c[0];
    c[0] = c[n - 1];
    c[n - 1] = t;
    sift_down(c, n - 1, 0, above);
}

/* Top-k straight from the logits: a min-heap of the best k seen so far,
 * whose root (the worst of them) most tokens fail to beat with a single
 * comparison, so the scan costs O(V) plus O(log k) per replacement.
 * Popping the heap empty then leaves c[0..n) best first. Returns n, which
 * is less than k when fewer than k logits are above -inf. */
static size_t select_top_k(cand *c, const float *logits, int32_t V, size_t k)
{
    size_t n = 0;
    int32_t i = 0;
    for (; i < V && n < k; i++)
        if (logits[i] > -INFINITY)
            c[n++] = (cand){.logit = logits[i], .w = 0.0f, .id = i};
    heapify(c, n, worse);
    for (; i < V; i++) {
        const cand x = {.logit = logits[i], .w = 0.0f, .id = i};
        if (better(&x, &c[0])) { /* -inf never beats a member */
            c[0] = x;
            sift_down(c, n, 0, worse);
        }
    }
    for (size_t h = n; h > 1; h--)
        heap_pop(c, h, worse); /* the worst goes last */
    return n;
}

/* The shortest best-first prefix of c[0..n) whose weight, added to cum,
 * reaches target; at least one token. Pops a max-heap one token at a time,
 * so it costs O(n + m log n) for the m tokens kept, and leaves those m at
 * c[0..m) best first. */
static size_t heap_prefix(cand *c, size_t n, double cum, double target)
{
    heapify(c, n, better);
    size_t m = 0;
    while (m < n) {
        heap_pop(c, n - m, better);
        cum += c[n - m - 1].w;
        m++;
        if (cum >= target)
            break;
    }
    /* The pops filled c[n-m..n) worst first: reverse into c[0..m). */
    cand *tail = c + (n - m);
    for (size_t a = 0, b = m; a + 1 < b; a++, b--) {
        const cand t = tail[a];
        tail[a] = tail[b - 1];
        tail[b - 1] = t;
    }
    memmove(c, tail, m * sizeof *c);
    return m;
}

/* Bucket of a candidate by (max - logit) / T, the negative log of its
 * weight, over [0, span]: non-decreasing as the logit falls (each float
 * operation here is monotonic), so the buckets cut the sorted order into
 * consecutive runs. */
static size_t top_p_bucket(const cand *x, float max, float T, float scale)
{
    const float b = (max - x->logit) / T * scale;
    return b < (float)(TOP_P_BUCKETS - 1) ? (size_t)b : TOP_P_BUCKETS - 1;
}

/* Top-p over a large unsorted set without sorting it: the weight of each
 * bucket says which bucket the cut falls in; every bucket before it is
 * kept whole, every one after it dropped, and only the tokens of that one
 * bucket are ordered (heap_prefix). Typically O(n); at worst, when all
 * tokens share a bucket, heap_prefix's O(n log n). Returns the number
 * kept, moved to c[0..). */
static size_t top_p_bucketed(bn_sampler *s, cand *c, size_t n, float max, double target)
{
    const float T = s->p.temperature;
    float span = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float key = (max - c[i].logit) / T;
        if (key > span)
            span = key;
    }
    const float scale = (float)(TOP_P_BUCKETS - 1) / span;
    if (!(span > 0.0f) || !isfinite(scale)) /* one logit value: nothing to split */
        return heap_prefix(c, n, 0.0, target);

    double *mass = s->bucket_mass;
    memset(mass, 0, sizeof s->bucket_mass);
    for (size_t i = 0; i < n; i++)
        mass[top_p_bucket(&c[i], max, T, scale)] += c[i].w;
    double cum = 0.0;
    size_t cut = 0;
    while (cut < TOP_P_BUCKETS && cum + mass[cut] < target)
        cum += mass[cut++];
    if (cut == TOP_P_BUCKETS) /* only through rounding: keep everything */
        return n;

    /* Buckets before the cut to the front, then the cut bucket. */
    size_t front = 0;
    for (size_t i = 0; i < n; i++) {
        if (top_p_bucket(&c[i], max, T, scale) < cut) {
            const cand t = c[front];
            c[front++] = c[i];
            c[i] = t;
        }
    }
    size_t end = front;
    for (size_t i = front; i < n; i++) {
        if (top_p_bucket(&c[i], max, T, scale) == cut) {
            const cand t = c[end];
            c[end++] = c[i];
            c[i] = t;
        }
    }
    return front + heap_prefix(c + front, end - front, cum, target);
}

static int32_t argmax(const float *logits, int32_t n)
{
    /* Strict > keeps the lowest index on ties; NaN was cleaned to -inf, and
     * with every logit -inf there is nothing to choose. */
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return logits[best] > -INFINITY ? best : BN_SAMPLER_NO_TOKEN;
}

/* ------------------------------------------------------------------------ */
/* Sampling                                                                  */
/* ------------------------------------------------------------------------ */

int32_t bn_sampler_sample(bn_sampler *s, float *logits, const int32_t *history, size_t n_history)
{
    if (!s || !logits)
        return -1;
    const int32_t V = s->vocab;

    apply_repeat_penalty(s, logits, history, n_history);
    /* NaN: never chosen. +inf: infinitely more likely than any finite
     * logit, so the +inf tokens share all the probability, equally (the
     * limit of equal logits growing without bound). */
    int32_t n_pinf = 0;
    for (int32_t i = 0; i < V; i++) {
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
        else if (logits[i] == INFINITY)
            n_pinf++;
    }
    if (n_pinf > 0)
        for (int32_t i = 0; i < V; i++)
            logits[i] = logits[i] == INFINITY ? 0.0f : -INFINITY;

    if (!(s->p.temperature > 0.0f))
        return argmax(logits, V);

    /* Drawn now, whatever happens below, so that every sampled call
     * advances the stream by exactly one step. */
    const double u = rng_uniform(s->rng);

    /* The working set c[0..n): top-k's tokens best first (`sorted`), or
     * every token above -inf in index order (-inf tokens have probability 0
     * under any filter, so leaving them out changes nothing). */
    cand *c = s->cands;
    size_t n = 0;
    bool sorted = false;
    const int k = s->p.top_k;
    if (k > 0 && k < V) {
        n = select_top_k(c, logits, V, (size_t)k);
        sorted = true;
    } else {
        for (int32_t i = 0; i < V; i++)
            if (logits[i] > -INFINITY)
                c[n++] = (cand){.logit = logits[i], .w = 0.0f, .id = i};
    }
    if (n == 0)
        return BN_SAMPLER_NO_TOKEN; /* every logit NaN or -inf */

    float max = c[0].logit;
    for (size_t i = 1; i < n; i++)
        if (c[i].logit > max)
            max = c[i].logit;

    /* Temperature and softmax together. Subtracting the max before dividing
     * keeps every exponent <= 0 (no overflow, the best token's weight is
     * exactly 1) and avoids logit / T overflowing for a tiny T.
     * logit - max may itself overflow to -inf (e.g. -FLT_MAX - FLT_MAX),
     * which correctly gives weight 0. The sum is in double and in array
     * order, both deterministic. */
    const float T = s->p.temperature;
    double z = 0.0;
    for (size_t i = 0; i < n; i++) {
        c[i].w = expf((c[i].logit - max) / T);
        z += c[i].w;
    }

    /* Min-p before top-p. The documented order is top-p then min-p, and the
     * result is the same: min-p keeps w >= min_p * w_max, a condition on
     * ratios that top-p's renormalisation does not change, so both keep a
     * prefix of the sorted order and together keep the shorter one. Doing
     * min-p first costs O(n) and leaves top-p less to order. Since w_max is
     * 1, the threshold is min_p itself; capping it at 1 keeps the best
     * token even for min_p > 1. Tokens whose weight underflowed to 0 go
     * too: they cannot be drawn, and top-p never needs them to reach its
     * mass. The compaction keeps the order. */
    const float thr = s->p.min_p < 1.0f ? s->p.min_p : 1.0f;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].w > 0.0f && c[i].w >= thr)
            c[m++] = c[i];
    n = m;

    /* Top-p: the smallest best-first prefix whose probability (normalised
     * over the top-k set, z, not over what min-p left) reaches top_p; at
     * least one token. If min-p left fewer, those are all kept. */
    if (s->p.top_p < 1.0f && n > 1) {
        const double target = (double)s->p.top_p * z;
        if (sorted) {
            double cum = 0.0;
            size_t keep = 0;
            while (keep < n) {
                cum += c[keep++].w;
                if (cum >= target)
                    break;
            }
            n = keep;
        } else if (n <= TOP_P_HEAP_MAX) {
            n = heap_prefix(c, n, 0.0, target);
        } else {
            n = top_p_bucketed(s, c, n, max, target);
        }
    }

    /* Draw: the first token whose cumulative weight passes u * total. */
    double total = 0.0;
    for (size_t i = 0; i < n; i++)
        total += c[i].w;
    const double target = u * total;
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].w;
        if (target < cum)
            return c[i].id;
    }
    /* Only reachable through rounding in the sums (u < 1 in exact
     * arithmetic); every weight kept is > 0, so the last token is the
     * right limit. */
    return c[n - 1].id;
}
