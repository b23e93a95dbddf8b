// Matrix products for the decoder's linear layers on the CPU: y = x W^T with x in fp32 and W
// stored in bf16 or int8 (per-row scales), accumulated in fp32. They read each weight once per
// call whatever the number of rows of x, which is what decoding needs: a step over 16 sequences
// costs little more memory traffic than a step over one. ATen's bf16 and int8 paths on CPUs without
// AVX-512 bf16 / AMX convert through bf16 arithmetic and are several times slower.
//
// Weights are packed once, at load time, in groups of eight rows: for each group and each run of
// eight columns, the 8 x 8 weights lie together, so a pass over a group reads one sequential
// stream (a layout the hardware prefetcher follows at full memory bandwidth; eight separate row
// streams reach about two thirds of it). Rows and columns are padded with zeros to multiples of 8.
// The AMX path packs tiles of 16 rows x 32 columns (bf16) or 64 (int8) instead, one tile
// register's load each; its int8 products take x as 15-bit fixed point, not bf16.
//
// Every output element is computed with the same sequence of operations whatever the number of
// rows of x and however the columns are split: a sequence's results do not depend on which other
// sequences share its step (batch invariance).
//
// No torch here. The caller splits the output columns across threads: each call computes the
// columns [n_begin, n_end) of y, so calls on disjoint ranges may run at once.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice::llm {

// An allocator whose construction without a value leaves the element uninitialised, so a scratch
// vector grows without first zeroing what is about to be overwritten.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  explicit UninitializedAllocator(const UninitializedAllocator<U>& /*other*/) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <class T>
using ScratchVector = std::vector<T, UninitializedAllocator<T>>;

// The code paths, in order: each runs where the CPU (and, for AMX, the kernel) has its
// instructions. The AMX and AVX-512 BF16 paths round x to bf16 before multiplying (the products
// and sums stay fp32); the others keep x fp32. Within one path every row's result is the same
// whatever the other rows; across paths results differ by rounding.
enum class KernelIsa { kPortable, kAvx2, kAvx512Bf16, kAmx };

// The best path this CPU has.
KernelIsa BestKernelIsa();
const char* KernelIsaName(KernelIsa isa);
// The path in use: "amx", "avx512bf16", "avx2" or "portable".
const char* CpuKernelIsa();
// Runs the best path at or below `limit` (tests and benchmarks; the default is no limit). Weights
// are packed for the path in use when they are packed (AMX has a layout of its own): change the
// limit only before packing.
void LimitKernelIsa(KernelIsa limit);

// Elements of the packed form of an [n, k] matrix on any path: n rounded up to a multiple of 16,
// k to one of 64.
int64_t PackedSize(int64_t n, int64_t k);

// w: [n, k] row-major. packed: PackedSize(n, k) elements.
void PackBf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed);
void PackInt8(const int8_t* w, int64_t n, int64_t k, int8_t* packed);

// x: [m, k] fp32, row stride k. w: [n, k] bf16 bits (the upper half of an fp32), packed by
// PackBf16. y: [m, n] fp32, row stride n; columns [n_begin, n_end) are written (not accumulated).
// n_begin is a multiple of 8; so is n_end unless it is n.
void MatmulBf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
                int64_t n_begin, int64_t n_end);

// As above with w int8 packed by PackInt8, and y[i, j] = scales[j] * sum_k x[i, k] w[j, k].
void MatmulInt8(const float* x, int64_t m, int64_t k, const int8_t* w, const float* scales,
                int64_t n, float* y, int64_t n_begin, int64_t n_end);

// x made ready once for one product on the path in use (rounded to bf16 and rearranged where the
// path needs it), then read by the calls on each of its column ranges, concurrently if need be.
// With int8_weights it is made ready for int8 weights (on AMX, a form of its own).
struct MatmulInput {
  void Prepare(const float* x_rows, int64_t rows, int64_t columns, bool int8_weights = false);
  // Prepare in two parts, for threads to share: Reserve on one thread, then Fill over disjoint
  // ranges of the Units() pieces of work, all of them done before the products start.
  void Reserve(const float* x_rows, int64_t rows, int64_t columns, bool int8_weights = false);
  int64_t Units() const;
  void Fill(int64_t unit_begin, int64_t unit_end);

  const float* x = nullptr;  // [m, k], not owned.
  int64_t m = 0, k = 0;
  KernelIsa isa = KernelIsa::kPortable;  // The path at Prepare time.
  bool for_int8 = false;
  ScratchVector<uint16_t> rows;   // AVX-512 BF16: x in bf16, padded rows.
  ScratchVector<uint32_t> pairs;  // AMX: x's pairs of columns, 16 rows at a time.
  // AMX with int8 weights: each row of x as 15-bit fixed point (row_scales), its high and low
  // bytes as two rows, in groups of four columns, 16 rows at a time.
  ScratchVector<uint32_t> quads;
  ScratchVector<float> row_scales;
};
void MatmulBf16(const MatmulInput& x, const uint16_t* w, int64_t n, float* y, int64_t n_begin,
                int64_t n_end);
void MatmulInt8(const MatmulInput& x, const int8_t* w, const float* scales, int64_t n, float* y,
                int64_t n_begin, int64_t n_end);

// Attention of `groups` queries (one KV head's query group, one new token each) over `len` cached
// positions: out[g] = softmax(q[g] . k[j] * scale over j) . v. q: [groups, d]; k, v: [len, d] rows
// of the cache; out: [groups, d]; scratch: at least groups * len floats. sinks: null, or one
// logit per group that joins its softmax's denominator and adds no value (gpt-oss's attention
// sinks: out[g] = sum_j e^(s_j) v[j] / (e^(sinks[g]) + sum_j e^(s_j))); the AMX paths take none,
// so a call with sinks goes the AVX-512 path there.
void DecodeAttention(const float* q, int groups, const float* k, const float* v, int64_t len,
                     int64_t d, float scale, float* out, float* scratch,
                     const float* sinks = nullptr);
// As above over a cache held in bf16 (bits): half the bytes to read. On the AMX path (d a
// multiple of 32 up to 128, up to 16 groups) the scores are tile products of the cached keys and
// the queries rounded to bf16.
void DecodeAttention(const float* q, int groups, const uint16_t* k, const uint16_t* v, int64_t len,
                     int64_t d, float scale, float* out, float* scratch,
                     const float* sinks = nullptr);
// As DecodeAttention for `rows` consecutive tokens of one sequence: row r's queries at q + r
// q_stride attend the first len - rows + 1 + r positions (the last row all len), its result at
// out + r out_stride; scratch: at least rows * groups * len floats. Each row gets the bits
// DecodeAttention gives it alone; the AVX-512 path (without AMX) widens each cached key once for
// every row, and past 8,192 positions goes a tile of 2,048 at a time, its softmax carried across
// tiles (avx512.cc's TiledAttentionRows).
void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups, const float* k,
                         const float* v, int64_t len, int64_t d, float scale, float* out,
                         int64_t out_stride, float* scratch, const float* sinks = nullptr);
void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups, const uint16_t* k,
                         const uint16_t* v, int64_t len, int64_t d, float scale, float* out,
                         int64_t out_stride, float* scratch, const float* sinks = nullptr);
// A KV cache in q8_0 (half a bf16 cache's bytes, as llama.cpp's -ctk q8_0 -ctv q8_0): each 32
// values of a cached row as int8 with one fp32 scale, d = max |x| / 127 and q = round(x / d)
// (llama.cpp keeps d in fp16). QuantizeKvRow writes n values (a multiple of 32) of one row:
// q[0 .. n), scales[0 .. n / 32).
void QuantizeKvRow(const float* x, int64_t n, int8_t* q, float* scales);
// DecodeAttentionRows over such a cache: k and v as above with rows of d values (d a multiple of
// 32), each 32 values of k scaled by k_scales[their element offset from k / 32], v's by v_scales.
// The keys and values are widened to fp32 in registers (AVX-512) and the rest is the fp32 path's;
// elsewhere the rows are widened into a buffer first.
void DecodeAttentionRows(const float* q, int64_t q_stride, int rows, int groups, const int8_t* k,
                         const float* k_scales, const int8_t* v, const float* v_scales, int64_t len,
                         int64_t d, float scale, float* out, int64_t out_stride, float* scratch,
                         const float* sinks = nullptr);
// x rounded to bf16 bits, to nearest even (AVX-512 BF16's instruction where the path has it,
// which also flushes denormals to zero).
void ToBf16(const float* x, int64_t n, uint16_t* out);

// The index of the first largest of x[0 .. n) (as std::max_element); 0 when n is 0.
int64_t ArgMax(const float* x, int64_t n);

// SwiGLU: out[t, c] = silu(gate_up[t, c]) * gate_up[t, inter + c] for each of `rows` rows of
// gate_up ([rows, 2 inter]: the gate, then the up projection); out: [rows, inter].
void SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float* out);
// GeGLU (gemma's): out[t, c] = gelu(gate) * up with GELU's tanh form, gelu(g) = g / 2 (1 +
// tanh(u)), u = sqrt(2 / pi) (g + 0.044715 g^3), computed as g sigmoid(2 u).
void GeGlu(const float* gate_up, int64_t rows, int64_t inter, float* out);

// RMSNorm of each of `rows` rows of x ([rows, width]):
// out[t] = weight * x[t] / sqrt(mean(x[t]^2) + eps), in fp32 as transformers computes it (the sum
// of squares in sixteen lanes on AVX-512, so its rounding differs from a sequential sum's).
void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out);

// Products with weights in GGUF's block formats (llm/kernels/ggml_blocks.h: Q8_0, Q4_0, Q4_1, Q4_K,
// Q5_K, Q6_K), read as the file holds them: x is quantised per block of 32 columns to int8 (a scale
// per block, round to nearest), each 32 weights are unpacked to signed bytes with their scale (two
// for Q6_K's blocks of 16) and offset, and the byte products are summed in int32 (as llama.cpp
// does), then scaled and added in fp32. The instructions, best first: AVX-512 VNNI (VPDPBUSD on
// 256-bit vectors), AVX-VNNI, AVX2 (VPMADDUBSW + VPMADDWD), a portable loop.
enum class QuantIsa { kPortable, kAvx2, kAvxVnni, kAvx512Vnni };
QuantIsa BestQuantIsa();
const char* QuantIsaName(QuantIsa isa);
// The path in use: "avx512vnni", "avxvnni", "avx2" or "portable" (SLUICE_QUANT_KERNELS caps it);
// "amx+avx512vnni" where AMX's int8 tiles take the Q8_0 and Q4_0 products of 16 rows or more
// (Intel Sapphire Rapids and later, unless SLUICE_QUANT_KERNELS names another path), with the
// AVX-512 VNNI path's results to the bit.
const char* QuantKernelIsa();
void LimitQuantIsa(QuantIsa limit);
void UseAmxQuant(bool on);  // Where the CPU has the tiles.
// The grid types' repacked products on the AVX-512 VNNI path (IQ2_XS, IQ3_S) read their grids
// with AVX-512 VBMI's permutes where the CPU has them, with the same results: kWhereFaster (IQ2_XS
// everywhere, IQ3_S on AMD CPUs, whose gathers are slow) unless SLUICE_QUANT_KERNELS names a path
// (avx512vnni: that path without them, kNone) or set here (kAll: both types on every such CPU).
enum class VbmiGrids { kNone, kWhereFaster, kAll };
void UseVbmiGrids(VbmiGrids which);
// Whether products of `ggml_type` read its grid by the permutes.
bool VbmiGridsInUse(uint32_t ggml_type);
// Products of kInt8TileRows rows of x or more (prompts) over repacked K-quant weights (Q3_K, Q4_K,
// Q5_K, Q6_K) on the AVX-512 VNNI path: each sixteen weight rows converted once a product to int8
// (a scale per row and 256 columns: the file's values rounded a second time, to within half of
// 1/127 of the super-block's largest magnitude) and x quantised per 256 columns (llama.cpp's
// Q8_K), so the inner loop is VPDPBUSD and its loads alone, with one fp32 step per 256 columns.
// Their results are not the bits of fewer rows' products. On unless SLUICE_INT8_TILES=off, or
// SLUICE_QUANT_KERNELS names a path (that path exactly), or turned off here.
inline constexpr int64_t kInt8TileRows = 48;
void UseInt8Tiles(bool on);
bool Int8TilesInUse();
// ggml_blocks.h's TakesInt8Tiles names the types whose repacked weights take them.

// Whether Sluice multiplies by weights of this ggml type in their blocks (the types above).
bool IsQuantType(uint32_t ggml_type);
// Bytes of one row of k weights of a quantised type (k a multiple of its block).
int64_t QuantRowBytes(uint32_t ggml_type, int64_t k);
// n values (a multiple of 32) as Q8_0 blocks, as llama.cpp quantises them: per 32, d = max |w| /
// 127 (stored as fp16) and q = round(w / d). `blocks`: n / 32 * 34 bytes.
void QuantizeQ8_0(const float* w, int64_t n, void* blocks);
// Row `row` of k weights to fp32 (any type GgmlBlockLayout knows, floats included).
void DequantizeRow(uint32_t ggml_type, const void* row, int64_t k, float* out);

// x quantised for the products: per row and block of 32 columns, q = round(x / d) with d = max |x|
// / 127, and d * sum(q). k a multiple of 32.
struct QuantInput {
  void Prepare(const float* x_rows, int64_t rows, int64_t columns);
  // Prepare in two parts, for threads to share: Reserve on one thread, then Fill over disjoint
  // ranges of rows, all of them done before the products start. tiles_wanted: whether x is
  // made for the int8 tiles as well where they apply (false: no weights it meets take them).
  // tiles_alone: the tiles take every product on x whole (repacked Q3_K-Q6_K weights, column
  // ranges of whole sixteens), so where they apply x is quantised per 256 alone (per_run false).
  void Reserve(const float* x_rows, int64_t rows, int64_t columns, bool tiles_wanted = true,
               bool tiles_alone = false);
  void Fill(int64_t row_begin, int64_t row_end);
  void Quantize(int64_t row_begin, int64_t row_end);  // Fill's first part.
  const float* x = nullptr;                           // Not owned.
  int64_t m = 0, k = 0;
  ScratchVector<int8_t> q;     // [m, k].
  ScratchVector<float> scale;  // [m, k / 32].
  ScratchVector<float> q_sum;  // [m, k / 32]: scale * sum(q).
  // [m, k / 16]: the sum of each 16 of q (Q6_K's products take its weights as unsigned, q + 32,
  // and subtract 32 times these).
  ScratchVector<int32_t> half_sum;
  // With more than one row: the same, grouped as the repacked products read it (GroupQuantRows,
  // groups of group_rows), once for every call on this input.
  int64_t group_rows = 0;
  ScratchVector<int8_t> grouped_q;
  ScratchVector<float> grouped_scale, grouped_q_sum;
  ScratchVector<int32_t> grouped_half_sum;
  // With kInt8TileRows rows or more where Int8TilesInUse() (and k a multiple of 256): x quantised
  // per 256 columns as well (d = max |x| / 127, q = round(x / d)), in groups of kTileGroupRows
  // rows laid out as grouped_q is (step s of 256-column block b of row i of the group from row g
  // at tile_q[g k + 256 R b + 4 (R s + i)]), d at tile_scale[g k / 256 + R b + i] and -128 times
  // the block's sum of q at tile_offset's same place (the tiles' weights are 128 high).
  bool tiles = false;
  // Whether q, scale, q_sum, half_sum and their grouped forms are made: false where Reserve was
  // told that the tiles take every product and they apply. A product the tiles do not take whole
  // meets such an input with x quantised again for it (MatmulQuant, MatmulQuantRepacked).
  bool per_run = true;
  ScratchVector<int8_t> tile_q;
  ScratchVector<float> tile_scale;
  ScratchVector<int32_t> tile_offset;
};
inline constexpr int64_t kTileGroupRows = 8;
// Rows [row_begin, row_end) of x's quantisation into the layout the repacked products read: the m
// rows in groups of `group_rows` and a last group of the rest; in a group of R rows from row g,
// run c's step s (4 bytes) of row g + i at q[g k + 32 R c + 4 (R s + i)], its scale and sum at
// [g k / 32 + R c + i], its half sums at 2 of that and the next. A pass over R rows then reads x
// through one pointer, where a pointer a row (3 R of them) ran the compiler out of registers.
void GroupQuantRows(const QuantInput& x, int64_t group_rows, int64_t row_begin, int64_t row_end,
                    int8_t* q, float* scale, float* q_sum, int32_t* half_sum);
// y[i, j] = sum_c x[i, c] w[j, c] for j in [n_begin, n_end): w holds n rows of x.k weights of
// `ggml_type`, one after the other. Calls on disjoint column ranges may run at once.
void MatmulQuant(const QuantInput& x, uint32_t ggml_type, const void* w, int64_t n, float* y,
                 int64_t n_begin, int64_t n_end);

// The same products over weights repacked for them, in the same bytes (every type above, with a
// multiple of 8 rows): for every eight rows and run of 32 columns (K-quants: super-block of 256),
// one record holding the eight rows' fp16 scales (and Q4_1's and Q5_1's offsets; the K-quants' d,
// dmin and 6- or 8-bit run scales, laid out to unpack eight rows at once) side by side, then their
// weights four bytes of each row a vector (Q5_0's and Q5_1's fifth bits after them), the order the
// products read them in. A
// product then streams each eight rows from one place and transposes nothing; its results have the
// same bits as MatmulQuant's on the file's layout. (Unpacking and transposing eight rows' blocks
// cost more than a row of x's products, so on the file's layout a step that verifies four draft
// tokens took twice a one-token step.)
bool CanRepackQuant(uint32_t ggml_type, int64_t rows);
// w: n rows of k weights of `ggml_type` as the file holds them; `out`: n * QuantRowBytes bytes.
void RepackQuant(uint32_t ggml_type, const void* w, int64_t n, int64_t k, void* out);
void MatmulQuantRepacked(const QuantInput& x, uint32_t ggml_type, const void* w, int64_t n,
                         float* y, int64_t n_begin, int64_t n_end);
// Row `row` of weights RepackQuant laid out (n rows of k), to fp32: DequantizeRow's values for
// the row as the file held it. A tied embedding's lookups read the output head's repacked copy
// this way, so the file's pages of it are never mapped again.
void DequantizeRepackedRow(uint32_t ggml_type, const void* w, int64_t k, int64_t row, float* out);

// fp32 <-> bf16 bits, rounding to nearest even (NaN stays NaN).
uint16_t Fp32ToBf16(float value);
float Bf16ToFp32(uint16_t bits);
// IEEE half bits to and from fp32 (to: rounding to nearest even; beyond the range: infinity).
float Fp16ToFp32(uint16_t bits);
uint16_t Fp32ToFp16(float value);

}  // namespace sluice::llm
