// GGUF block-format products on every path this CPU has, against a scalar reference: the weights
// dequantised by DequantizeRow, x as its int8 quantisation stands for it, summed in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/internal.h"
#include "llm/kernels/kernels.h"

namespace sluice::llm {
namespace {

uint16_t ToHalf(float value) {
  // Exact for the values used here (small integers times powers of two, normal range).
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  const uint32_t mantissa = (bits >> 13) & 0x3FFu;
  if (value == 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) | mantissa);
}

void PutHalf(uint8_t* at, float value) {
  const uint16_t bits = ToHalf(value);
  std::memcpy(at, &bits, 2);
}

// n rows of k weights of `type`: random bytes, with every fp16 scale set to a sane value (random
// bytes there could be Inf or NaN).
std::vector<uint8_t> RandomRows(uint32_t type, int64_t n, int64_t k, std::mt19937& rng) {
  int64_t block = 0, block_bytes = 0;
  EXPECT_TRUE(GgmlBlockLayout(type, &block, &block_bytes));
  std::vector<uint8_t> rows(static_cast<size_t>(n * k / block * block_bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : rows) b = static_cast<uint8_t>(byte(rng));
  std::uniform_int_distribution<int> power(-12, -6);
  auto scale = [&] { return std::ldexp(1.0f + static_cast<float>(byte(rng) % 8) / 8, power(rng)); };
  for (size_t at = 0; at < rows.size(); at += static_cast<size_t>(block_bytes)) {
    uint8_t* b = rows.data() + at;
    switch (static_cast<GgmlType>(type)) {
      case GgmlType::kQ8_0:
        PutHalf(b, scale());
        for (int l = 0; l < 32; ++l) {  // llama.cpp's quantiser writes -127 .. 127.
          if (b[2 + l] == 0x80) b[2 + l] = 0x81;
        }
        break;
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
        PutHalf(b, scale());
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        PutHalf(b, scale());
        PutHalf(b + 2, (byte(rng) % 2 ? -1.0f : 1.0f) * scale());
        break;
      case GgmlType::kQ6_K:
        PutHalf(b + 208, scale());
        break;
      case GgmlType::kQ2_K:
        PutHalf(b + 80, scale());
        PutHalf(b + 82, (byte(rng) % 2 ? -1.0f : 1.0f) * scale());
        break;
      case GgmlType::kQ3_K:
        PutHalf(b + 108, scale());
        break;
      case GgmlType::kIQ4_NL:
      case GgmlType::kIQ4_XS:
      case GgmlType::kIQ3_S:
      case GgmlType::kIQ2_XS:
        PutHalf(b, scale());
        break;
      case GgmlType::kMXFP4:  // An E8M0 power of two, 2^(e - 127).
        b[0] = static_cast<uint8_t>(127 + power(rng));
        break;
      default:
        break;
    }
  }
  return rows;
}

// The low-bit types' expected products come from quant_lowbit.cc's dequantisation, written apart
// from the products' unpacking (and checked against the gguf package in gguf_model_test).
constexpr GgmlType kTypes[] = {
    GgmlType::kQ8_0,   GgmlType::kQ4_0,   GgmlType::kQ4_1,  GgmlType::kQ5_0,   GgmlType::kQ5_1,
    GgmlType::kQ4_K,   GgmlType::kQ5_K,   GgmlType::kQ6_K,  GgmlType::kQ2_K,   GgmlType::kQ3_K,
    GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kIQ3_S, GgmlType::kIQ2_XS, GgmlType::kMXFP4};
constexpr QuantIsa kPaths[] = {QuantIsa::kPortable, QuantIsa::kAvx2, QuantIsa::kAvxVnni,
                               QuantIsa::kAvx512Vnni};

// Rows RandomRows made, as RepackQuant lays them out.
std::vector<uint8_t> Repacked(uint32_t type, const std::vector<uint8_t>& w, int64_t n, int64_t k) {
  std::vector<uint8_t> repacked(w.size(), 0);
  RepackQuant(type, w.data(), n, k, repacked.data());
  return repacked;
}

bool PathOnThisCpu(QuantIsa isa) {
  const QuantIsa best = BestQuantIsa();
  if (isa == best || isa <= QuantIsa::kAvx2) return best >= isa;
  return false;  // AVX-VNNI on an AVX-512 VNNI CPU (or the reverse) is not run.
}

class QuantMatmulTest
    : public ::testing::TestWithParam<std::tuple<GgmlType, QuantIsa, std::tuple<int, int, int>>> {
 protected:
  void TearDown() override { LimitQuantIsa(QuantIsa::kAvx512Vnni); }
};

TEST_P(QuantMatmulTest, EqualsTheDequantisedProduct) {
  const auto [type_enum, isa, shape] = GetParam();
  const auto type = static_cast<uint32_t>(type_enum);
  if (!PathOnThisCpu(isa)) GTEST_SKIP() << QuantIsaName(isa) << " is not this CPU's";
  LimitQuantIsa(isa);
  // AVX-512 VNNI's path takes AMX's tiles beside it where the CPU has them.
  const bool amx = isa == QuantIsa::kAvx512Vnni && kernels::quant_amx::Usable();
  ASSERT_EQ(std::string(QuantKernelIsa()), amx ? "amx+avx512vnni" : QuantIsaName(isa));
  const auto [m, n, k] = shape;
  std::mt19937 rng(static_cast<unsigned>(type * 7919 + m * 131 + n * 17 + k));
  const std::vector<uint8_t> w = RandomRows(type, n, k, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  x[0] = 0;  // A block with zeros in it.
  QuantInput input;
  input.Prepare(x.data(), m, k);
  std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
  // Two column ranges, as two threads would split them.
  MatmulQuant(input, type, w.data(), n, y.data(), 0, n / 2);
  MatmulQuant(input, type, w.data(), n, y.data(), n / 2, n);

  const int64_t row_bytes = QuantRowBytes(type, k);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    DequantizeRow(type, w.data() + j * row_bytes, k, row.data());
    for (int64_t i = 0; i < m; ++i) {
      double expected = 0, magnitude = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double xv =
            static_cast<double>(input.scale[static_cast<size_t>(i * k / 32 + c / 32)]) *
            input.q[static_cast<size_t>(i * k + c)];
        expected += xv * row[static_cast<size_t>(c)];
        magnitude += std::abs(xv * row[static_cast<size_t>(c)]);
      }
      ASSERT_NEAR(y[static_cast<size_t>(i * n + j)], expected, 2e-6 * magnitude + 1e-30)
          << GgmlTypeName(type) << " on " << QuantIsaName(isa) << ", row " << i << ", column " << j;
    }
  }
}

std::string CaseName(
    const ::testing::TestParamInfo<std::tuple<GgmlType, QuantIsa, std::tuple<int, int, int>>>&
        info) {
  const auto [type, isa, shape] = info.param;
  const auto [m, n, k] = shape;
  return GgmlTypeName(static_cast<uint32_t>(type)) + "_" + QuantIsaName(isa) + "_m" +
         std::to_string(m) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantMatmulTest,
                         ::testing::Combine(::testing::ValuesIn(kTypes),
                                            ::testing::ValuesIn(kPaths),
                                            ::testing::Values(std::make_tuple(1, 7, 512),
                                                              std::make_tuple(6, 9, 256),
                                                              std::make_tuple(17, 5, 768))),
                         CaseName);

// The layouts as llama.cpp writes them, one hand-made block each.
TEST(QuantLayout, Q4_0AndQ4_1NibblesAndScales) {
  uint8_t q4_0[18] = {};
  PutHalf(q4_0, 0.5f);
  q4_0[2] = 0x1F;   // Weight 0: 15 - 8 = 7; weight 16: 1 - 8 = -7.
  q4_0[17] = 0x80;  // Weight 15: 0 - 8; weight 31: 8 - 8.
  float out[32];
  DequantizeRow(static_cast<uint32_t>(GgmlType::kQ4_0), q4_0, 32, out);
  EXPECT_EQ(out[0], 3.5f);
  EXPECT_EQ(out[16], -3.5f);
  EXPECT_EQ(out[15], -4.0f);
  EXPECT_EQ(out[31], 0.0f);
  uint8_t q4_1[20] = {};
  PutHalf(q4_1, 0.25f);
  PutHalf(q4_1 + 2, -1.0f);
  q4_1[4] = 0xF2;  // Weight 0: 2 * 0.25 - 1; weight 16: 15 * 0.25 - 1.
  DequantizeRow(static_cast<uint32_t>(GgmlType::kQ4_1), q4_1, 32, out);
  EXPECT_EQ(out[0], -0.5f);
  EXPECT_EQ(out[16], 2.75f);
  EXPECT_EQ(out[1], -1.0f);
}

TEST(QuantLayout, Q4_KAndQ6_KScalesAndRuns) {
  uint8_t q4k[144] = {};
  PutHalf(q4k, 0.5f);
  PutHalf(q4k + 2, 0.25f);
  // Run 1: scale 3, min 2 (low six bits of bytes 1 and 5); run 5: scale 0x2A (low nibble of byte
  // 9, high bits from byte 1's top two), min 0x15 (byte 9's high nibble, byte 5's top two).
  q4k[4 + 1] = 3 | (2 << 6);
  q4k[4 + 5] = 2 | (1 << 6);
  q4k[4 + 9] = 0xA | (0x5 << 4);
  q4k[16 + 0] = 0x70;       // Run 0 weight 0: 0; run 1 weight 0: 7.
  q4k[16 + 64 + 3] = 0x90;  // Run 5 weight 3: 9 (runs 4, 5 share bytes 64 .. 95).
  float out[256];
  DequantizeRow(static_cast<uint32_t>(GgmlType::kQ4_K), q4k, 256, out);
  EXPECT_EQ(out[32], 0.5f * 3 * 7 - 0.25f * 2);
  EXPECT_EQ(out[160 + 3], 0.5f * 0x2A * 9 - 0.25f * 0x15);
  EXPECT_EQ(out[0], 0.0f);  // Run 0: scale 0, min 0.

  uint8_t q6k[210] = {};
  PutHalf(q6k + 208, 0.5f);
  auto* scales = reinterpret_cast<int8_t*>(q6k + 192);
  scales[2] = -3;       // Weights 32 .. 47.
  scales[9] = 5;        // Second half (weights 128 ..), weights 144 .. 159.
  q6k[32] = 0x0B;       // Weight 32: low nibble 11 ...
  q6k[128] = 0x04;      // ... high bits 1 (qh byte 0, bits 2-3): q = 11 + 16 - 32 = -5.
  q6k[64 + 16] = 0x03;  // Weight 144: low nibble 3, high bits 0: 3 - 32.
  DequantizeRow(static_cast<uint32_t>(GgmlType::kQ6_K), q6k, 256, out);
  EXPECT_EQ(out[32], 0.5f * -3 * -5);
  EXPECT_EQ(out[144], 0.5f * 5 * (3 - 32));
}

// IQ3_S: entries 1 and 261 of ggml's codebook (iq3s_grid: 0x01010103, 0x05090f0b), a ninth
// index bit, signs and two runs' scales.
TEST(QuantLayout, Iq3SGridIndicesSignsAndScales) {
  uint8_t block[110] = {};
  PutHalf(block, 0.5f);
  block[106] = 0x30;  // Run 0: d (1 + 2 * 0); run 1: d (1 + 2 * 3).
  block[2 + 1] = 1;   // Run 0, weights 4 .. 7: entry 1, magnitudes 3, 1, 1, 1.
  block[74] = 0x01;   // Run 0, weight 0 (entry 0, magnitude 1): negative.
  block[2 + 10] = 5;  // Run 1, weights 40 .. 43: entry 5 ...
  block[66 + 1] = 4;  // ... with its ninth bit (index 2 of run 1): 261, magnitudes 11, 15, 9, 5.
  block[74 + 5] = 2;  // Run 1, weight 41 (its ninth): negative.
  float out[256];
  for (const bool repeat : {false, true}) {  // Through DequantizeRow and a product's unpacking.
    if (repeat) {
      kernels::quant::Chunk chunk;
      for (int c = 0; c < 8; ++c) {
        kernels::quant::UnpackChunk(static_cast<uint32_t>(GgmlType::kIQ3_S), block, c, &chunk);
        for (int l = 0; l < 32; ++l) out[32 * c + l] = chunk.scale[0] * chunk.q[l];
      }
    } else {
      DequantizeRow(static_cast<uint32_t>(GgmlType::kIQ3_S), block, 256, out);
    }
    EXPECT_EQ(out[0], -0.5f);
    EXPECT_EQ(out[1], 0.5f);
    EXPECT_EQ(out[4], 1.5f);
    EXPECT_EQ(out[5], 0.5f);
    EXPECT_EQ(out[40], 3.5f * 11);
    EXPECT_EQ(out[41], -3.5f * 15);
    EXPECT_EQ(out[42], 3.5f * 9);
    EXPECT_EQ(out[43], 3.5f * 5);
    EXPECT_EQ(out[44], 3.5f);  // Entry 0.
  }
}

// IQ2_XS: entries 1 and 511 of ggml's codebook (iq2xs_grid: 0x080808080808082b, eight 0x2b), the
// eighth sign bit that makes a word's count even, and a run's two 4-bit scales.
TEST(QuantLayout, Iq2XsGridIndicesSignsAndScales) {
  uint8_t block[74] = {};
  PutHalf(block, 0.5f);
  block[66] = 0x30;  // Run 0: weights 0 .. 15 d (0.5 + 0) / 4, weights 16 .. 31 d (0.5 + 3) / 4.
  const uint16_t words[4] = {
      1 | (1 << 9),    // Weights 0 .. 7: entry 1 (43, 8, ...), weight 0 negative, so weight 7 too.
      0,               // Weights 8 .. 15: entry 0 (all 8).
      511,             // Weights 16 .. 23: entry 511 (all 43).
      511 | (3 << 9),  // Weights 24 .. 31: two signs set, an even count: weight 31 positive.
  };
  std::memcpy(block + 2, words, sizeof words);
  float out[256];
  for (const bool repeat : {false, true}) {  // Through DequantizeRow and a product's unpacking.
    if (repeat) {
      kernels::quant::Chunk chunk;
      for (int c = 0; c < 8; ++c) {
        kernels::quant::UnpackChunk(static_cast<uint32_t>(GgmlType::kIQ2_XS), block, c, &chunk);
        for (int l = 0; l < 32; ++l) out[32 * c + l] = chunk.scale[l / 16] * chunk.q[l];
      }
    } else {
      DequantizeRow(static_cast<uint32_t>(GgmlType::kIQ2_XS), block, 256, out);
    }
    EXPECT_EQ(out[0], -0.0625f * 43);
    EXPECT_EQ(out[1], 0.0625f * 8);
    EXPECT_EQ(out[6], 0.0625f * 8);
    EXPECT_EQ(out[7], -0.0625f * 8);
    EXPECT_EQ(out[8], 0.0625f * 8);
    EXPECT_EQ(out[16], 0.4375f * 43);
    EXPECT_EQ(out[24], -0.4375f * 43);
    EXPECT_EQ(out[25], -0.4375f * 43);
    EXPECT_EQ(out[31], 0.4375f * 43);
    EXPECT_EQ(out[32], 0.0625f * 8);  // Run 1: entry 0, scale 0.
  }
}

// MXFP4: E2M1 codes (doubled, as ggml keeps them) times 2^(e - 128), E8M0's subnormal corner
// included: e = 0 and 1 are 2^-128 and 2^-127 halved from 2^-127 and 2^-126, not zero.
TEST(QuantLayout, Mxfp4CodesAndPowersOfTwo) {
  EXPECT_EQ(kernels::quant::E8m0Half(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(kernels::quant::E8m0Half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(kernels::quant::E8m0Half(127), 0.5f);
  EXPECT_EQ(kernels::quant::E8m0Half(254), std::ldexp(1.0f, 126));
  uint8_t block[17] = {};
  block[0] = 129;    // 2^2 = 4 a unit of E2M1 (w = 2^(e - 127) x the code's value).
  block[1] = 0x9F;   // Weight 0: code 15 (-6); weight 16: code 9 (-0.5).
  block[2] = 0x53;   // Weight 1: code 3 (1.5); weight 17: code 5 (3).
  block[16] = 0x08;  // Weight 15: code 8 (-0).
  float out[32];
  for (const bool repeat : {false, true}) {  // Through DequantizeRow and a product's unpacking.
    if (repeat) {
      kernels::quant::Chunk chunk;
      kernels::quant::UnpackChunk(static_cast<uint32_t>(GgmlType::kMXFP4), block, 0, &chunk);
      for (int l = 0; l < 32; ++l) out[l] = chunk.scale[0] * chunk.q[l];
    } else {
      DequantizeRow(static_cast<uint32_t>(GgmlType::kMXFP4), block, 32, out);
    }
    EXPECT_EQ(out[0], -24.0f);
    EXPECT_EQ(out[16], -2.0f);
    EXPECT_EQ(out[1], 6.0f);
    EXPECT_EQ(out[17], 12.0f);
    EXPECT_EQ(out[15], 0.0f);
    EXPECT_EQ(out[2], 0.0f);
  }
}

// OCP MX blocks as the released gpt-oss checkpoints store them (two blocks, value 2 i in byte i's
// low nibble), moved into ggml's MXFP4 blocks: every value, read back by DequantizeRow, is its
// E2M1 code's value times 2^(scale - 127) as the OCP format defines it (0, 0.5, 1, 1.5, 2, 3, 4,
// 6; bit 3 the sign).
TEST(QuantLayout, Mxfp4FromOcpBlocksKeepsEveryValue) {
  constexpr float kE2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  uint8_t codes[32], scales[2] = {127 + 3, 127 - 5};
  for (int i = 0; i < 32; ++i) codes[i] = static_cast<uint8_t>((7 * i + 3) % 256);
  uint8_t ggml[34];
  Mxfp4FromOcpBlocks(codes, scales, 2, ggml);
  EXPECT_EQ(ggml[0], scales[0]);
  EXPECT_EQ(ggml[17], scales[1]);
  float out[64];
  DequantizeRow(static_cast<uint32_t>(GgmlType::kMXFP4), ggml, 64, out);
  for (int b = 0; b < 2; ++b) {
    for (int v = 0; v < 32; ++v) {
      const int code = (codes[16 * b + v / 2] >> (4 * (v % 2))) & 0xF;
      const float value = (code & 8 ? -1.0f : 1.0f) * kE2m1[code & 7];
      EXPECT_EQ(out[32 * b + v], std::ldexp(value, scales[b] - 127)) << "block " << b << " " << v;
    }
  }
}

TEST(QuantInputTest, BlocksOfThirtyTwoRoundToNearest) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i - 20) / 8;
  QuantInput input;
  input.Prepare(x.data(), 1, 64);
  ASSERT_EQ(input.scale.size(), 2u);
  EXPECT_FLOAT_EQ(input.scale[0], 20.0f / 8 / 127);  // Block 0's largest magnitude: |-20 / 8|.
  EXPECT_EQ(input.q[0], -127);
  EXPECT_EQ(input.q[20], 0);
  int sum = 0;
  for (int c = 32; c < 64; ++c) sum += input.q[static_cast<size_t>(c)];
  EXPECT_FLOAT_EQ(input.q_sum[1], input.scale[1] * static_cast<float>(sum));
  EXPECT_EQ(input.q[63], 127);
}

// Repacked weights give every product the bits the file's layout gives it, on every path, for
// every count of x's rows (the vector paths take them four or eight at a time) and for column
// ranges that start and end inside a group of eight rows, or take whole groups (AVX-512's path
// takes two whole groups, sixteen rows, at once, their scales made as it goes or, above 32 rows of
// x, from a table made first). Where the CPU has AVX-512 VBMI, IQ2_XS's and
// IQ3_S's products with their grids read by permutes (one row of x, and sixteen columns at once;
// on every such CPU, not only where they are faster) and without them.
TEST(QuantRepackTest, RepackedProductsEqualTheFileLayouts) {
  for (const auto& [isa, vbmi] : {std::pair{QuantIsa::kPortable, false},
                                  {QuantIsa::kAvx2, false},
                                  {QuantIsa::kAvxVnni, false},
                                  {QuantIsa::kAvx512Vnni, false},
                                  {QuantIsa::kAvx512Vnni, true}}) {
    if (!PathOnThisCpu(isa)) continue;
    LimitQuantIsa(isa);
    UseVbmiGrids(vbmi ? VbmiGrids::kAll : VbmiGrids::kNone);
    if (VbmiGridsInUse(static_cast<uint32_t>(GgmlType::kIQ3_S)) != vbmi) continue;  // No VBMI.
    for (GgmlType type_enum :
         {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
          GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ2_K, GgmlType::kQ3_K,
          GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kIQ3_S, GgmlType::kIQ2_XS,
          GgmlType::kMXFP4}) {
      const auto type = static_cast<uint32_t>(type_enum);
      constexpr int64_t n = 40;
      // Two super-blocks for the K-quants (a record each), ten blocks for the others.
      const int64_t k = kernels::quant::BlockElements(type) == 256 ? 512 : 320;
      ASSERT_TRUE(CanRepackQuant(type, n));
      std::mt19937 rng(static_cast<unsigned>(type) + 11);
      const std::vector<uint8_t> w = RandomRows(type, n, k, rng);
      const std::vector<uint8_t> repacked = Repacked(type, w, n, k);
      ASSERT_NE(w, repacked);
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 14, 17, 40}) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(m * k));
        for (float& v : x) v = normal(rng);
        QuantInput input;
        input.Prepare(x.data(), m, k);
        std::vector<float> file(static_cast<size_t>(m * n), -1.0f);
        MatmulQuant(input, type, w.data(), n, file.data(), 0, n);
        using Ranges = std::vector<std::pair<int64_t, int64_t>>;
        for (const Ranges& ranges : {Ranges{{0, 13}, {13, 19}, {19, n}}, Ranges{{0, n}}}) {
          std::vector<float> packed(file.size(), -2.0f);
          for (auto [begin, end] : ranges) {
            MatmulQuantRepacked(input, type, repacked.data(), n, packed.data(), begin, end);
          }
          for (int64_t i = 0; i < m * n; ++i) {
            ASSERT_EQ(packed[static_cast<size_t>(i)], file[static_cast<size_t>(i)])
                << GgmlTypeName(type) << " on " << QuantIsaName(isa) << (vbmi ? " with VBMI" : "")
                << ", " << m << " rows, row " << i / n << ", column " << i % n << ", "
                << ranges.size() << " ranges";
          }
        }
      }
    }
  }
  LimitQuantIsa(QuantIsa::kAvx512Vnni);
  UseVbmiGrids(VbmiGrids::kWhereFaster);
}

// x's grouped layout: 13 rows in a group of 8 and one of 5, each run's steps of the group's rows
// side by side; and an input prepared on one path (groups of 8) gives the same products on a path
// that groups by 4 (it groups again for itself).
TEST(QuantRepackTest, GroupedRowsAndAnInputPreparedForAnotherPath) {
  constexpr int64_t m = 13, k = 64, runs = k / 32;
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  QuantInput input;
  input.Prepare(x.data(), m, k);
  std::vector<int8_t> q(input.q.size());
  std::vector<float> scale(input.scale.size()), q_sum(input.q_sum.size());
  std::vector<int32_t> half_sum(input.half_sum.size());
  GroupQuantRows(input, 8, 0, m, q.data(), scale.data(), q_sum.data(), half_sum.data());
  for (int64_t r = 0; r < m; ++r) {
    const int64_t first = r < 8 ? 0 : 8, rows = r < 8 ? 8 : 5, i = r - first;
    for (int64_t c = 0; c < runs; ++c) {
      for (int64_t s = 0; s < 8; ++s) {
        for (int64_t b = 0; b < 4; ++b) {
          ASSERT_EQ(q[static_cast<size_t>(first * k + 32 * rows * c + 4 * (rows * s + i) + b)],
                    input.q[static_cast<size_t>(r * k + 32 * c + 4 * s + b)])
              << "row " << r << ", run " << c << ", step " << s;
        }
      }
      EXPECT_EQ(scale[static_cast<size_t>(first * runs + rows * c + i)],
                input.scale[static_cast<size_t>(r * runs + c)]);
      EXPECT_EQ(q_sum[static_cast<size_t>(first * runs + rows * c + i)],
                input.q_sum[static_cast<size_t>(r * runs + c)]);
      for (int64_t h = 0; h < 2; ++h) {
        int32_t want = 0;
        for (int64_t b = 0; b < 16; ++b) {
          want += input.q[static_cast<size_t>(r * k + 32 * c + 16 * h + b)];
        }
        EXPECT_EQ(input.half_sum[static_cast<size_t>(2 * (r * runs + c) + h)], want);
        EXPECT_EQ(half_sum[static_cast<size_t>(2 * (first * runs + rows * c + i) + h)], want);
      }
    }
  }
  if (!PathOnThisCpu(QuantIsa::kAvx512Vnni)) GTEST_SKIP() << "one grouping on this CPU";
  ASSERT_EQ(input.group_rows, 8);
  constexpr int64_t n = 24;
  const auto type = static_cast<uint32_t>(GgmlType::kQ4_1);
  const std::vector<uint8_t> w = RandomRows(type, n, k, rng);
  std::vector<uint8_t> repacked(w.size());
  RepackQuant(type, w.data(), n, k, repacked.data());
  LimitQuantIsa(QuantIsa::kAvx2);
  std::vector<float> file(static_cast<size_t>(m * n)), packed(file.size());
  MatmulQuant(input, type, w.data(), n, file.data(), 0, n);
  MatmulQuantRepacked(input, type, repacked.data(), n, packed.data(), 0, n);
  LimitQuantIsa(QuantIsa::kAvx512Vnni);
  EXPECT_EQ(packed, file);
}

// AMX's int8 tiles for Q8_0 and Q4_0 (quant_amx.cc): the code over tiles emulated in C++ gives the
// AVX2 path's results to the bit on every CPU with AVX2 (the same integer sums, the same fp32
// steps in the same order), for 1 to 40 rows of x (a last block of fewer than 16) and column
// ranges that start and end inside a group of eight. Where the CPU has AMX, the tiles themselves
// give the AVX-512 VNNI path's bits, called directly and through MatmulQuantRepacked.
TEST(QuantAmxTest, TilesGiveTheVectorPathsBits) {
  if (BestQuantIsa() < QuantIsa::kAvx2) GTEST_SKIP() << "no vector path on this CPU";
  const bool amx = kernels::quant_amx::Usable() && BestQuantIsa() == QuantIsa::kAvx512Vnni;
  EXPECT_EQ(std::string(QuantKernelIsa()) == "amx+avx512vnni", amx);
  for (GgmlType type_enum : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const auto type = static_cast<uint32_t>(type_enum);
    constexpr int64_t n = 40, k = 320;
    std::mt19937 rng(static_cast<unsigned>(type) + 41);
    const std::vector<uint8_t> w = RandomRows(type, n, k, rng);
    const std::vector<uint8_t> repacked = Repacked(type, w, n, k);
    for (int64_t m : {1, 5, 16, 17, 31, 40}) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(m * k));
      for (float& v : x) v = normal(rng);
      QuantInput input;
      input.Prepare(x.data(), m, k);
      std::vector<float> expected(static_cast<size_t>(m * n), -1.0f), tiles(expected.size(), -2.0f);
      kernels::quant_avx2::RepackedMatmul(input, type, repacked.data(), n, expected.data(), 0, n);
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 13}, {13, 19}, {19, n}}) {
        kernels::quant_amx_emulated::RepackedMatmul(input, type, repacked.data(), n, tiles.data(),
                                                    begin, end);
      }
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(tiles[static_cast<size_t>(i)], expected[static_cast<size_t>(i)])
            << GgmlTypeName(type) << " on emulated tiles, " << m << " rows, row " << i / n
            << ", column " << i % n;
      }
      if (!amx) continue;
      std::vector<float> vnni(expected.size(), -3.0f), real(expected.size(), -4.0f),
          dispatched(expected.size(), -5.0f);
      kernels::quant_avx512vnni::RepackedMatmul(input, type, repacked.data(), n, vnni.data(), 0, n);
      kernels::quant_amx::RepackedMatmul(input, type, repacked.data(), n, real.data(), 0, n);
      MatmulQuantRepacked(input, type, repacked.data(), n, dispatched.data(), 0, n);
      EXPECT_EQ(real, vnni) << GgmlTypeName(type) << " on AMX, " << m << " rows";
      EXPECT_EQ(dispatched, vnni) << GgmlTypeName(type) << " through the dispatch, " << m;
    }
  }
}

// A row read back from the repacked layout has DequantizeRow's values for the file's row, bit
// for bit: a tied embedding's lookups read the output head's repacked copy.
TEST(QuantRepackTest, RowsReadBackEqualTheFileRows) {
  for (GgmlType type_enum : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                             GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                             GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
                             GgmlType::kIQ3_S, GgmlType::kIQ2_XS, GgmlType::kMXFP4}) {
    const auto type = static_cast<uint32_t>(type_enum);
    constexpr int64_t n = 24;
    const int64_t k = kernels::quant::BlockElements(type) == 256 ? 768 : 96;
    std::mt19937 rng(static_cast<unsigned>(type) + 29);
    const std::vector<uint8_t> w = RandomRows(type, n, k, rng);
    const std::vector<uint8_t> repacked = Repacked(type, w, n, k);
    const int64_t row_bytes = QuantRowBytes(type, k);
    std::vector<float> expected(static_cast<size_t>(k)), actual(static_cast<size_t>(k));
    for (int64_t row = 0; row < n; ++row) {
      DequantizeRow(type, w.data() + row * row_bytes, k, expected.data());
      std::fill(actual.begin(), actual.end(), -1.0f);
      DequantizeRepackedRow(type, repacked.data(), k, row, actual.data());
      for (int64_t c = 0; c < k; ++c) {
        const float a = actual[static_cast<size_t>(c)], e = expected[static_cast<size_t>(c)];
        // The low-bit types' file rows are d x level (quant_lowbit.cc), -0 where a negative d
        // meets a zero scale; the records' rows scale x q + 0, +0 there.
        if (a == 0 && e == 0) continue;
        ASSERT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(e))
            << GgmlTypeName(type) << ", row " << row << ", column " << c;
      }
    }
  }
}

TEST(QuantRepackTest, OnlyWholeGroupsOfEightRows) {
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ4_1), 576));
  EXPECT_FALSE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ4_1), 20));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ4_K), 576));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ6_K), 576));
  EXPECT_FALSE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ5_K), 20));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ5_0), 576));
  EXPECT_FALSE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ5_1), 12));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kIQ4_NL), 576));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kIQ4_XS), 576));
  EXPECT_FALSE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kIQ4_XS), 20));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ2_K), 576));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ3_K), 576));
  EXPECT_FALSE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kQ3_K), 12));
  EXPECT_FALSE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kF16), 576));
  EXPECT_TRUE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kIQ3_S), 576));
  EXPECT_FALSE(CanRepackQuant(static_cast<uint32_t>(GgmlType::kIQ3_S), 20));
}

}  // namespace
}  // namespace sluice::llm

namespace sluice::llm {
namespace {

TEST(HalfTest, EveryHalfRoundTripsAndFloatsRoundToNearest) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto half = static_cast<uint16_t>(bits);
    const float value = Fp16ToFp32(half);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(value))));
      continue;
    }
    ASSERT_EQ(Fp32ToFp16(value), half) << "half 0x" << std::hex << bits;
  }
  EXPECT_EQ(Fp16ToFp32(Fp32ToFp16(1.0f + 1.0f / 4096)), 1.0f);  // A tie: to even.
  EXPECT_EQ(Fp16ToFp32(Fp32ToFp16(1.0f + 3.0f / 4096)), 1.0f + 4.0f / 4096);
  EXPECT_TRUE(std::isinf(Fp16ToFp32(Fp32ToFp16(70000.0f))));
  EXPECT_EQ(Fp16ToFp32(Fp32ToFp16(1e-7f)), std::ldexp(2.0f, -24));  // Subnormal: 1.68 x 2^-24.
}

// Within half a step, and the scale's own rounding to fp16 (2^-11 relative) times the largest q.
TEST(QuantizeQ8_0Test, BlocksHoldEachWeightWithinHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(256);
  for (float& v : w) v = normal(rng);
  std::fill(w.begin() + 32, w.begin() + 64, 0.0f);  // An all-zero block.
  std::vector<uint8_t> blocks(256 / 32 * 34);
  QuantizeQ8_0(w.data(), 256, blocks.data());
  std::vector<float> back(256);
  DequantizeRow(static_cast<uint32_t>(GgmlType::kQ8_0), blocks.data(), 256, back.data());
  for (int b = 0; b < 8; ++b) {
    float amax = 0;
    for (int l = 0; l < 32; ++l)
      amax = std::max(amax, std::abs(w[static_cast<size_t>(b * 32 + l)]));
    for (int l = 0; l < 32; ++l) {
      const auto i = static_cast<size_t>(b * 32 + l);
      EXPECT_NEAR(back[i], w[i], amax / 127 * 0.5f + amax * std::ldexp(1.0f, -11) + 1e-9f)
          << "weight " << i;
    }
  }
  EXPECT_EQ(back[40], 0.0f);
}

}  // namespace
}  // namespace sluice::llm

namespace sluice::llm {
namespace {

// x's quantisation is the same on each vector path as on the portable loop, to the bit, ties
// (values exactly halfway between two steps) included, for block counts that fill the AVX-512
// path's groups of sixteen and leave a part of one (5 rows of 7 blocks: 2 x 16 + 3).
TEST(QuantInputTest, VectorPathEqualsThePortableLoop) {
  if (BestQuantIsa() < QuantIsa::kAvx2) GTEST_SKIP() << "no vector path on this CPU";
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t rows = 5, k = 224;
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (float& v : x) v = normal(rng);
  for (int l = 0; l < 32; ++l) x[static_cast<size_t>(l)] = static_cast<float>(l - 16) * 0.5f;
  x[31] = 127.0f * 0.5f;  // Block 0's scale is 0.5: its values fall on steps and halfway.
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  std::fill(x.begin() + 32 * 20, x.begin() + 32 * 21, 1e-3f);  // One value: d = 1e-3 / 127.
  QuantInput portable;
  LimitQuantIsa(QuantIsa::kPortable);
  portable.Prepare(x.data(), rows, k);
  EXPECT_EQ(portable.q[1], -15);  // -7.5 / 0.5 = -15 exactly.
  for (QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (!PathOnThisCpu(isa)) continue;
    SCOPED_TRACE(QuantIsaName(isa));
    LimitQuantIsa(isa);
    QuantInput vector_path;
    vector_path.Prepare(x.data(), rows, k);
    EXPECT_EQ(std::vector<int8_t>(vector_path.q.begin(), vector_path.q.end()),
              std::vector<int8_t>(portable.q.begin(), portable.q.end()));
    EXPECT_EQ(std::vector<float>(vector_path.scale.begin(), vector_path.scale.end()),
              std::vector<float>(portable.scale.begin(), portable.scale.end()));
    EXPECT_EQ(std::vector<float>(vector_path.q_sum.begin(), vector_path.q_sum.end()),
              std::vector<float>(portable.q_sum.begin(), portable.q_sum.end()));
  }
  LimitQuantIsa(QuantIsa::kAvx512Vnni);
}

}  // namespace
}  // namespace sluice::llm

namespace sluice::llm {
namespace {

// A row of x gets the same bits from the products whatever rows are beside it (the decoder's
// batch invariance: a sequence's logits do not change with the other sequences of its step), on
// every path and format.
// Int8 tiles (many-row K-quant products on AVX-512 VNNI): the products of kInt8TileRows rows of x
// and 6 more (a last group of 6) against the file's values (DequantizeRow) and x's own, summed in
// double, are within a relative error of 1.2/100 (measured 0.8-1.0; the 32-column path's 0.5-0.6,
// bound at 0.7), the same whether a
// call takes whole pairs of groups or ragged column ranges (those outside whole pairs take the
// 32-column path), and differ from that path's results (the tiles ran). Rows of x below
// kInt8TileRows, or with the tiles off, keep that path's bits.
TEST(QuantTileTest, ManyRowProductsWithinTheirBound) {
  LimitQuantIsa(QuantIsa::kAvx512Vnni);
  UseInt8Tiles(true);
  if (!Int8TilesInUse()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  for (GgmlType type_enum : {GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const auto type = static_cast<uint32_t>(type_enum);
    constexpr int64_t n = 48, k = 768;
    std::mt19937 rng(static_cast<unsigned>(type) + 5);
    const std::vector<uint8_t> w = RandomRows(type, n, k, rng);
    const std::vector<uint8_t> repacked = Repacked(type, w, n, k);
    std::vector<double> weights(static_cast<size_t>(n * k));
    const int64_t row_bytes = QuantRowBytes(type, k);
    for (int64_t j = 0; j < n; ++j) {
      std::vector<float> row(static_cast<size_t>(k));
      DequantizeRow(type, w.data() + j * row_bytes, k, row.data());
      std::copy(row.begin(), row.end(), weights.begin() + j * k);
    }
    for (int64_t m : {kInt8TileRows, kInt8TileRows + 6}) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(m * k));
      for (float& v : x) v = normal(rng);
      std::vector<double> exact(static_cast<size_t>(m * n));
      double norm = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double total = 0;
          for (int64_t c = 0; c < k; ++c) total += x[i * k + c] * weights[j * k + c];
          exact[i * n + j] = total;
          norm += total * total;
        }
      }
      const auto error = [&](const std::vector<float>& y) {
        double sum = 0;
        for (size_t e = 0; e < y.size(); ++e) sum += (y[e] - exact[e]) * (y[e] - exact[e]);
        return std::sqrt(sum / norm);
      };
      const std::string name = GgmlTypeName(type) + std::string(", ") + std::to_string(m) + " rows";
      UseInt8Tiles(false);
      QuantInput plain;
      plain.Prepare(x.data(), m, k);
      ASSERT_FALSE(plain.tiles);
      std::vector<float> vectors(exact.size());
      MatmulQuantRepacked(plain, type, repacked.data(), n, vectors.data(), 0, n);
      UseInt8Tiles(true);
      QuantInput input;
      input.Prepare(x.data(), m, k);
      ASSERT_TRUE(input.tiles) << name;
      std::vector<float> whole(exact.size(), -1.0f), ragged(exact.size(), -2.0f);
      MatmulQuantRepacked(input, type, repacked.data(), n, whole.data(), 0, n);
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 16}, {16, 24}, {24, n}}) {
        MatmulQuantRepacked(input, type, repacked.data(), n, ragged.data(), begin, end);
      }
      EXPECT_LT(error(vectors), 0.007) << name;
      EXPECT_LT(error(whole), 0.012) << name;
      EXPECT_LT(error(ragged), 0.012) << name;
      int64_t differ = 0;
      for (size_t e = 0; e < exact.size(); ++e) {
        const int64_t j = static_cast<int64_t>(e) % n;
        differ += whole[e] != vectors[e];
        // `ragged` takes columns 0-15 and 24-39 as pairs, 16-23 and 40-47 by the 32-column path.
        if ((j >= 16 && j < 24) || j >= 40) {
          ASSERT_EQ(ragged[e], vectors[e]) << name << ", column " << j;
        } else {
          ASSERT_EQ(ragged[e], whole[e]) << name << ", column " << j;
        }
      }
      EXPECT_GT(differ, m * n / 2) << name;
      // x made for the tiles alone (not per 32): the same bits, whole and ragged (the ranges the
      // tiles do not take whole quantise x again for themselves).
      QuantInput alone;
      alone.Reserve(x.data(), m, k, /*tiles_wanted=*/true, /*tiles_alone=*/true);
      alone.Fill(0, m);
      ASSERT_TRUE(alone.tiles) << name;
      ASSERT_FALSE(alone.per_run) << name;
      std::vector<float> alone_whole(exact.size(), -3.0f), alone_ragged(exact.size(), -4.0f);
      MatmulQuantRepacked(alone, type, repacked.data(), n, alone_whole.data(), 0, n);
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 16}, {16, 24}, {24, n}}) {
        MatmulQuantRepacked(alone, type, repacked.data(), n, alone_ragged.data(), begin, end);
      }
      EXPECT_EQ(alone_whole, whole) << name;
      EXPECT_EQ(alone_ragged, ragged) << name;
      std::printf("%s: relative error %.5f with the tiles, %.5f without\n", name.c_str(),
                  error(whole), error(vectors));
    }
  }
  // A type the tiles never take (Q8_0, repacked and in the file's layout) meets x made for them
  // alone with x quantised again: the bits of x made for both.
  {
    const auto q8 = static_cast<uint32_t>(GgmlType::kQ8_0);
    constexpr int64_t n = 32, k = 512, m = kInt8TileRows;
    std::mt19937 rng(11);
    const std::vector<uint8_t> w = RandomRows(q8, n, k, rng);
    const std::vector<uint8_t> repacked = Repacked(q8, w, n, k);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = normal(rng);
    QuantInput both, alone;
    both.Prepare(x.data(), m, k);
    alone.Reserve(x.data(), m, k, /*tiles_wanted=*/true, /*tiles_alone=*/true);
    alone.Fill(0, m);
    ASSERT_FALSE(alone.per_run);
    for (bool packed : {true, false}) {
      std::vector<float> want(static_cast<size_t>(m * n), -1.0f), got(want.size(), -2.0f);
      if (packed) {
        MatmulQuantRepacked(both, q8, repacked.data(), n, want.data(), 0, n);
        MatmulQuantRepacked(alone, q8, repacked.data(), n, got.data(), 0, n);
      } else {
        MatmulQuant(both, q8, w.data(), n, want.data(), 0, n);
        MatmulQuant(alone, q8, w.data(), n, got.data(), 0, n);
      }
      EXPECT_EQ(got, want) << (packed ? "repacked" : "file layout");
    }
  }
  // Fewer rows keep the 32-column path's bits.
  QuantInput few;
  std::vector<float> x(static_cast<size_t>((kInt8TileRows - 1) * 512), 0.5f);
  few.Prepare(x.data(), kInt8TileRows - 1, 512);
  EXPECT_FALSE(few.tiles);
  // Nor is x made for them where no weights it meets take them.
  x.resize(static_cast<size_t>(kInt8TileRows * 512), 0.5f);
  QuantInput unwanted;
  unwanted.Reserve(x.data(), kInt8TileRows, 512, /*tiles_wanted=*/false);
  EXPECT_FALSE(unwanted.tiles);
  unwanted.Reserve(x.data(), kInt8TileRows, 512);
  EXPECT_TRUE(unwanted.tiles);
  EXPECT_TRUE(TakesInt8Tiles(static_cast<uint32_t>(GgmlType::kQ6_K)));
  EXPECT_FALSE(TakesInt8Tiles(static_cast<uint32_t>(GgmlType::kQ8_0)));
}

TEST(QuantBatchTest, EachRowEqualsItselfAlone) {
  for (QuantIsa isa : kPaths) {
    if (!PathOnThisCpu(isa)) continue;
    LimitQuantIsa(isa);
    for (GgmlType type_enum : kTypes) {
      const auto type = static_cast<uint32_t>(type_enum);
      constexpr int64_t m = 13, n = 21, k = 512;  // 8 + 5 rows on AVX-512, 4 + 4 + 4 + 1 on AVX2.
      std::mt19937 rng(static_cast<unsigned>(type) + 3);
      const std::vector<uint8_t> w = RandomRows(type, n, k, rng);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(m * k));
      for (float& v : x) v = normal(rng);
      QuantInput all;
      all.Prepare(x.data(), m, k);
      std::vector<float> y(static_cast<size_t>(m * n));
      MatmulQuant(all, type, w.data(), n, y.data(), 0, n);
      for (int64_t i = 0; i < m; ++i) {
        QuantInput one;
        one.Prepare(x.data() + i * k, 1, k);
        std::vector<float> alone(static_cast<size_t>(n));
        MatmulQuant(one, type, w.data(), n, alone.data(), 3, n);  // Another column split too.
        MatmulQuant(one, type, w.data(), n, alone.data(), 0, 3);
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(alone[static_cast<size_t>(j)], y[static_cast<size_t>(i * n + j)])
              << GgmlTypeName(type) << " on " << QuantIsaName(isa) << ", row " << i << ", column "
              << j;
        }
      }
    }
  }
  LimitQuantIsa(QuantIsa::kAvx512Vnni);
}

}  // namespace
}  // namespace sluice::llm
