#include "llm/kernels/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace sluice::llm {
namespace {

struct Case {
  int64_t m, n, k;
};

constexpr KernelIsa kEveryIsa[] = {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512Bf16,
                                   KernelIsa::kAmx};

// Each case runs on every path this CPU has (the others are skipped).
class MatmulTest : public ::testing::TestWithParam<std::tuple<Case, KernelIsa>> {
 protected:
  void TearDown() override { LimitKernelIsa(KernelIsa::kAmx); }
  void SetUp() override {
    const KernelIsa isa = std::get<1>(GetParam());
    if (isa > BestKernelIsa()) GTEST_SKIP() << KernelIsaName(isa) << " is not on this CPU";
    LimitKernelIsa(isa);
    ASSERT_STREQ(CpuKernelIsa(), KernelIsaName(isa));
    const Case c = std::get<0>(GetParam());
    std::mt19937 rng(static_cast<unsigned>(c.m * 1000003 + c.n * 1009 + c.k));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(-127, 127);
    x.resize(static_cast<size_t>(c.m * c.k));
    for (float& v : x) v = normal(rng);
    w16.resize(static_cast<size_t>(c.n * c.k));
    for (uint16_t& v : w16) v = Fp32ToBf16(normal(rng) * 0.05f);
    w8.resize(static_cast<size_t>(c.n * c.k));
    for (int8_t& v : w8) v = static_cast<int8_t>(byte(rng));
    scales.resize(static_cast<size_t>(c.n));
    for (float& v : scales) v = 0.001f + std::abs(normal(rng)) * 0.01f;
    packed16.assign(static_cast<size_t>(PackedSize(c.n, c.k)), 0xffff);
    PackBf16(w16.data(), c.n, c.k, packed16.data());
    packed8.assign(static_cast<size_t>(PackedSize(c.n, c.k)), 99);
    PackInt8(w8.data(), c.n, c.k, packed8.data());
  }

  // sum_k x[i, k] * weight(j, k) in double, with x as the path sees it: the reference. The AMX and
  // AVX-512 BF16 paths round x to bf16, except AMX against int8 weights, which takes each row as
  // 15-bit fixed point (q = round(x * 16383 / max |x|)).
  template <class Weight>
  double Reference(int64_t i, int64_t j, Weight weight, bool int8_weights = false) const {
    const int64_t k = std::get<0>(GetParam()).k;
    const KernelIsa isa = std::get<1>(GetParam());
    const bool fixed_x = int8_weights && isa == KernelIsa::kAmx;
    const bool bf16_x = !fixed_x && isa >= KernelIsa::kAvx512Bf16;
    const float* row = x.data() + i * k;
    float largest = 0;
    for (int64_t c = 0; c < k; ++c) largest = std::max(largest, std::abs(row[c]));
    const float inverse = 16383.0f / largest;
    double sum = 0;
    for (int64_t c = 0; c < k; ++c) {
      double xv = row[c];
      if (fixed_x) xv = std::nearbyint(row[c] * inverse) * double{largest / 16383.0f};
      if (bf16_x) xv = Bf16ToFp32(Fp32ToBf16(row[c]));
      sum += xv * weight(j, c);
    }
    return sum;
  }

  std::vector<float> x, scales;
  std::vector<uint16_t> w16, packed16;
  std::vector<int8_t> w8, packed8;
};

TEST_P(MatmulTest, Bf16MatchesTheReferenceOnEveryColumnRange) {
  const Case c = std::get<0>(GetParam());
  auto weight = [&](int64_t j, int64_t col) {
    return double{Bf16ToFp32(w16[static_cast<size_t>(j * c.k + col)])};
  };
  // Two calls on disjoint column ranges (as two threads would make) fill all of y.
  std::vector<float> y(static_cast<size_t>(c.m * c.n), NAN);
  const int64_t split = c.n / 3 / 8 * 8;
  MatmulBf16(x.data(), c.m, c.k, packed16.data(), c.n, y.data(), 0, split);
  MatmulBf16(x.data(), c.m, c.k, packed16.data(), c.n, y.data(), split, c.n);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const double want = Reference(i, j, weight);
      ASSERT_NEAR(y[static_cast<size_t>(i * c.n + j)], want, 1e-4 * (1 + std::abs(want)))
          << "row " << i << " column " << j;
    }
  }
}

TEST_P(MatmulTest, Int8AppliesEachRowsScale) {
  const Case c = std::get<0>(GetParam());
  auto weight = [&](int64_t j, int64_t col) {
    return static_cast<double>(w8[static_cast<size_t>(j * c.k + col)]) *
           scales[static_cast<size_t>(j)];
  };
  std::vector<float> y(static_cast<size_t>(c.m * c.n), NAN);
  MatmulInt8(x.data(), c.m, c.k, packed8.data(), scales.data(), c.n, y.data(), 0, c.n);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const double want = Reference(i, j, weight, /*int8_weights=*/true);
      ASSERT_NEAR(y[static_cast<size_t>(i * c.n + j)], want, 1e-4 * (1 + std::abs(want)))
          << "row " << i << " column " << j;
    }
  }
}

TEST_P(MatmulTest, ColumnsOutsideTheRangeAreNotWritten) {
  const Case c = std::get<0>(GetParam());
  if (c.n <= 8) GTEST_SKIP();
  std::vector<float> y(static_cast<size_t>(c.m * c.n), -7.0f);
  MatmulBf16(x.data(), c.m, c.k, packed16.data(), c.n, y.data(), 8, c.n - 1);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const bool inside = j >= 8 && j < c.n - 1;
      EXPECT_EQ(y[static_cast<size_t>(i * c.n + j)] != -7.0f, inside) << i << ", " << j;
    }
  }
}

// Each row of y is bit for bit what x's row alone gives: a sequence's result does not depend on
// the others in its step, whichever block shape the number of rows selects.
TEST_P(MatmulTest, RowsDoNotDependOnTheOtherRows) {
  const Case c = std::get<0>(GetParam());
  std::vector<float> together(static_cast<size_t>(c.m * c.n)), alone(static_cast<size_t>(c.n));
  std::vector<float> together8(together.size()), alone8(alone.size());
  MatmulBf16(x.data(), c.m, c.k, packed16.data(), c.n, together.data(), 0, c.n);
  MatmulInt8(x.data(), c.m, c.k, packed8.data(), scales.data(), c.n, together8.data(), 0, c.n);
  for (int64_t i = 0; i < c.m; ++i) {
    const float* row = x.data() + i * c.k;
    MatmulBf16(row, 1, c.k, packed16.data(), c.n, alone.data(), 0, c.n);
    MatmulInt8(row, 1, c.k, packed8.data(), scales.data(), c.n, alone8.data(), 0, c.n);
    for (int64_t j = 0; j < c.n; ++j) {
      ASSERT_EQ(together[static_cast<size_t>(i * c.n + j)], alone[static_cast<size_t>(j)]);
      ASSERT_EQ(together8[static_cast<size_t>(i * c.n + j)], alone8[static_cast<size_t>(j)]);
    }
  }
}

TEST(Pack, GroupsEightRowsByRunsOfEightColumnsAndPadsWithZeros) {
  // 9 x 10: two groups of rows, two runs of columns, padded to 16 x 16.
  const int64_t n = 9, k = 10;
  std::vector<int8_t> w(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) w[static_cast<size_t>(i)] = static_cast<int8_t>(i % 100);
  LimitKernelIsa(KernelIsa::kAvx512Bf16);  // The layout of every path but AMX.
  ASSERT_EQ(PackedSize(n, k), 16 * 64);
  std::vector<int8_t> packed(static_cast<size_t>(PackedSize(n, k)), 99);
  PackInt8(w.data(), n, k, packed.data());
  // Row 1, columns 0-7: second run of eight in the first block.
  for (int l = 0; l < 8; ++l)
    EXPECT_EQ(packed[static_cast<size_t>(8 + l)], w[static_cast<size_t>(k + l)]);
  // Row 0, columns 8-9 then zeros: the first run of the second column block.
  EXPECT_EQ(packed[64], w[8]);
  EXPECT_EQ(packed[65], w[9]);
  for (int l = 2; l < 8; ++l) EXPECT_EQ(packed[static_cast<size_t>(64 + l)], 0);
  // Row 8 starts the second group; rows 9-15 are zeros.
  EXPECT_EQ(packed[128], w[static_cast<size_t>(8 * k)]);
  for (int l = 8; l < 64; ++l) EXPECT_EQ(packed[static_cast<size_t>(128 + l)], 0);
  LimitKernelIsa(KernelIsa::kAmx);
}

// bf16 tiles of 16 rows x 32 columns; int8 tiles of 16 rows x 64: one tile register's load each.
TEST(Pack, AmxTilesHoldSixteenRowsOfThirtyTwoOrSixtyFourColumns) {
  if (BestKernelIsa() != KernelIsa::kAmx) GTEST_SKIP() << "no AMX on this CPU";
  // 17 x 40: two tiles of rows by two of columns (bf16) or one (int8), padded to 32 x 64.
  const int64_t n = 17, k = 40;
  ASSERT_EQ(PackedSize(n, k), 32 * 64);
  std::vector<uint16_t> w16(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) w16[static_cast<size_t>(i)] = static_cast<uint16_t>(i + 1);
  std::vector<uint16_t> packed16(static_cast<size_t>(PackedSize(n, k)), 99);
  PackBf16(w16.data(), n, k, packed16.data());
  auto at16 = [&](int64_t i) { return packed16[static_cast<size_t>(i)]; };
  auto weight16 = [&](int64_t j, int64_t c) { return w16[static_cast<size_t>(j * k + c)]; };
  // Tile (0, 0): rows 0-15, columns 0-31, row after row.
  EXPECT_EQ(at16(0), weight16(0, 0));
  EXPECT_EQ(at16(31), weight16(0, 31));
  EXPECT_EQ(at16(32), weight16(1, 0));
  EXPECT_EQ(at16(15 * 32 + 31), weight16(15, 31));
  // Tile (0, 1): columns 32-39 then zeros.
  EXPECT_EQ(at16(512), weight16(0, 32));
  EXPECT_EQ(at16(512 + 7), weight16(0, 39));
  EXPECT_EQ(at16(512 + 8), 0);
  // Tile (1, 0): row 16, then zero rows.
  EXPECT_EQ(at16(1024), weight16(16, 0));
  EXPECT_EQ(at16(1024 + 32), 0);

  std::vector<int8_t> w(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) w[static_cast<size_t>(i)] = static_cast<int8_t>(i % 101);
  std::vector<int8_t> packed(static_cast<size_t>(PackedSize(n, k)), 99);
  PackInt8(w.data(), n, k, packed.data());
  auto at = [&](int64_t i) { return packed[static_cast<size_t>(i)]; };
  auto weight = [&](int64_t j, int64_t c) { return w[static_cast<size_t>(j * k + c)]; };
  // Tile (0, 0): rows 0-15, columns 0-39 then zeros to 63, row after row.
  EXPECT_EQ(at(0), weight(0, 0));
  EXPECT_EQ(at(39), weight(0, 39));
  EXPECT_EQ(at(40), 0);
  EXPECT_EQ(at(64), weight(1, 0));
  EXPECT_EQ(at(15 * 64 + 39), weight(15, 39));
  // Tile (1, 0): row 16, then zero rows.
  EXPECT_EQ(at(1024), weight(16, 0));
  EXPECT_EQ(at(1024 + 64), 0);
}

// Every row-block shape (1, 2-3, 4+ rows, with remainders), column remainders of each block
// width, and k with and without a tail of fewer than eight.
INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulTest,
    ::testing::Combine(::testing::Values(Case{1, 17, 64}, Case{1, 8, 5}, Case{2, 13, 72},
                                         Case{3, 11, 19}, Case{4, 9, 64}, Case{5, 7, 96},
                                         Case{7, 3, 13}, Case{16, 33, 576}, Case{64, 5, 136},
                                         Case{1, 1, 1}, Case{6, 40, 24}, Case{9, 64, 520},
                                         // Pairs of row blocks (AMX), a short second block,
                                         // an odd block left over.
                                         Case{20, 17, 96}, Case{40, 33, 64}, Case{33, 50, 40}),
                       ::testing::ValuesIn(kEveryIsa)),
    [](const ::testing::TestParamInfo<MatmulTest::ParamType>& info) {
      const Case c = std::get<0>(info.param);
      std::ostringstream name;
      name << "m" << c.m << "_n" << c.n << "_k" << c.k << "_"
           << KernelIsaName(std::get<1>(info.param));
      return name.str();
    });

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(NAN))));
  EXPECT_TRUE(std::isinf(Bf16ToFp32(Fp32ToBf16(INFINITY))));
  EXPECT_EQ(Bf16ToFp32(Fp32ToBf16(-2.5f)), -2.5f);
}

TEST(CpuKernelIsa, NamesThePathInUseAndHonoursTheLimit) {
  EXPECT_STREQ(CpuKernelIsa(), KernelIsaName(BestKernelIsa()));
  const std::string best = CpuKernelIsa();
  EXPECT_TRUE(best == "amx" || best == "avx512bf16" || best == "avx2" || best == "portable")
      << best;
  LimitKernelIsa(KernelIsa::kPortable);
  EXPECT_STREQ(CpuKernelIsa(), "portable");
  LimitKernelIsa(KernelIsa::kAmx);
  EXPECT_EQ(CpuKernelIsa(), best);
}

}  // namespace
}  // namespace sluice::llm

namespace sluice::llm {
namespace {

// Against a double-precision softmax attention, on every path, with head sizes that take the
// vector paths (multiples of 8 and 16; more groups than one pass over v holds), AMX's (multiples
// of 32 up to 128, up to 16 groups) and one that takes none.
// Attention over an fp32 cache, and over the same cache held in bf16: the reference reads the
// cached rows as the kernel stores them (rounded to bf16 for the second), and the queries as the
// kernel multiplies them (rounded to bf16 on AMX, whose products take bf16).
TEST(DecodeAttention, MatchesSoftmaxAttention) {
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    for (bool bf16 : {false, true}) {
      for (auto [groups, len, d] :
           {std::tuple{3, 1, 64}, std::tuple{3, 37, 64}, std::tuple{1, 200, 16},
            std::tuple{2, 9, 12}, std::tuple{5, 20, 48}, std::tuple{9, 33, 128},
            std::tuple{16, 48, 96}, std::tuple{4, 16, 32}, std::tuple{2, 70, 32},
            std::tuple{3, 300, 64}, std::tuple{4, 9000, 64}}) {
        std::mt19937 rng(static_cast<unsigned>(groups * 1000 + len * 10 + d));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> q(static_cast<size_t>(groups * d)), k(static_cast<size_t>(len * d)),
            v(k.size()), out(q.size()), scratch(static_cast<size_t>(groups * len));
        for (auto* t : {&q, &k, &v}) {
          for (float& x : *t) x = normal(rng);
        }
        // Scores that rise along the cache: each block (and past 8,192 positions, each tile of
        // AVX-512's) raises the maximum.
        if (len >= 300) {
          for (int j = 0; j < len; ++j) {
            const float rise = 0.6f * static_cast<float>(j) / static_cast<float>(len);
            for (int c = 0; c < d; ++c) k[j * d + c] += rise * q[c];
          }
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        if (bf16) {
          std::vector<uint16_t> k16(k.size()), v16(v.size());
          ToBf16(k.data(), static_cast<int64_t>(k.size()), k16.data());
          ToBf16(v.data(), static_cast<int64_t>(v.size()), v16.data());
          for (size_t i = 0; i < k.size(); ++i) {
            ASSERT_EQ(k16[i], Fp32ToBf16(k[i]));
            k[i] = Bf16ToFp32(k16[i]);
            v[i] = Bf16ToFp32(v16[i]);
          }
          DecodeAttention(q.data(), groups, k16.data(), v16.data(), len, d, scale, out.data(),
                          scratch.data());
          if (isa == KernelIsa::kAmx && d % 32 == 0 && d <= 128 && groups <= 16) {
            for (float& x : q) x = Bf16ToFp32(Fp32ToBf16(x));
          }
        } else {
          DecodeAttention(q.data(), groups, k.data(), v.data(), len, d, scale, out.data(),
                          scratch.data());
        }
        for (int g = 0; g < groups; ++g) {
          std::vector<double> p(static_cast<size_t>(len));
          double max = -1e300, total = 0;
          for (int j = 0; j < len; ++j) {
            double dot = 0;
            for (int c = 0; c < d; ++c) dot += double{q[g * d + c]} * k[j * d + c];
            p[j] = dot * scale;
            max = std::max(max, p[j]);
          }
          for (double& x : p) total += x = std::exp(x - max);
          for (int c = 0; c < d; ++c) {
            double want = 0;
            for (int j = 0; j < len; ++j) want += p[j] / total * v[j * d + c];
            ASSERT_NEAR(out[g * d + c], want, 1e-5)
                << KernelIsaName(isa) << (bf16 ? " bf16" : " fp32") << " group " << g;
          }
        }
      }
    }
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

// Consecutive tokens of one sequence together (a verifying step's drafts, a prompt's chunk): each
// row's result has the bits DecodeAttention gives it alone, on every path, over fp32 and bf16
// caches, with rows whose spans end inside a block of 16 positions, at its end, and past it, and
// (on AVX-512, which takes spans past 8,192 positions a tile of 2,048 at a time) runs whose rows
// straddle that bound or end inside a tile.
TEST(DecodeAttention, RowsTogetherEqualEachRowAlone) {
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    for (bool bf16 : {false, true}) {
      for (auto [rows, groups, len, d] :
           {std::tuple{1, 3, 40, 64}, std::tuple{5, 3, 18, 64}, std::tuple{5, 3, 259, 64},
            std::tuple{16, 2, 16, 32}, std::tuple{17, 4, 70, 128}, std::tuple{3, 2, 9, 12},
            std::tuple{4, 5, 33, 48}, std::tuple{16, 4, 8200, 64}, std::tuple{5, 2, 10300, 64}}) {
        SCOPED_TRACE(::testing::Message()
                     << KernelIsaName(isa) << (bf16 ? " bf16" : " fp32") << " rows " << rows
                     << " groups " << groups << " len " << len << " d " << d);
        std::mt19937 rng(static_cast<unsigned>(rows * 7919 + len * 31 + d));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        // q rows with a gap between them (a row of qkv holds the keys and values too).
        const int64_t q_stride = groups * d + 8, out_stride = groups * d + 4;
        std::vector<float> q(static_cast<size_t>(rows * q_stride)), k(static_cast<size_t>(len * d)),
            v(k.size()), together(static_cast<size_t>(rows * out_stride), -1.0f),
            scratch(static_cast<size_t>(rows * groups * len));
        for (auto* t : {&q, &k, &v}) {
          for (float& x : *t) x = normal(rng);
        }
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        ToBf16(k.data(), static_cast<int64_t>(k.size()), k16.data());
        ToBf16(v.data(), static_cast<int64_t>(v.size()), v16.data());
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        if (bf16) {
          DecodeAttentionRows(q.data(), q_stride, rows, groups, k16.data(), v16.data(), len, d,
                              scale, together.data(), out_stride, scratch.data());
        } else {
          DecodeAttentionRows(q.data(), q_stride, rows, groups, k.data(), v.data(), len, d, scale,
                              together.data(), out_stride, scratch.data());
        }
        for (int r = 0; r < rows; ++r) {
          const int64_t row_len = len - (rows - 1) + r;
          std::vector<float> alone(static_cast<size_t>(groups * d));
          if (bf16) {
            DecodeAttention(q.data() + r * q_stride, groups, k16.data(), v16.data(), row_len, d,
                            scale, alone.data(), scratch.data());
          } else {
            DecodeAttention(q.data() + r * q_stride, groups, k.data(), v.data(), row_len, d, scale,
                            alone.data(), scratch.data());
          }
          const float* row = together.data() + r * out_stride;
          ASSERT_EQ(std::vector<float>(row, row + groups * d), alone) << "row " << r;
          EXPECT_EQ(row[groups * d], -1.0f) << "row " << r << ": written past its heads";
        }
      }
    }
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

// Attention sinks (gpt-oss's): one logit a query head that joins its softmax's denominator and
// adds no value. On every path, over fp32, bf16 and q8_0 caches, rows together and alone (the AMX
// paths take no sinks: their calls go AVX-512's), spans a tile at a time past 8,192 positions:
// each result within 1e-5 of the double-precision formula, and a sink far below every score
// changes nothing, one far above scales the result towards zero.
TEST(DecodeAttention, SinksJoinTheSoftmaxOnEveryPath) {
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    for (int cache = 0; cache < 3; ++cache) {  // fp32, bf16, q8_0.
      for (auto [rows, groups, len, d] :
           {std::tuple{1, 4, 37, 64}, std::tuple{5, 2, 70, 64}, std::tuple{3, 3, 20, 32},
            std::tuple{2, 8, 33, 128}, std::tuple{4, 2, 8300, 64}}) {
        SCOPED_TRACE(::testing::Message() << KernelIsaName(isa) << " cache " << cache << " rows "
                                          << rows << " groups " << groups << " len " << len);
        std::mt19937 rng(static_cast<unsigned>(rows * 31 + groups * 7 + len));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        const int64_t q_stride = groups * d + 8, out_stride = groups * d;
        std::vector<float> q(static_cast<size_t>(rows * q_stride)), k(static_cast<size_t>(len * d)),
            v(k.size()), out(static_cast<size_t>(rows * out_stride)),
            scratch(static_cast<size_t>(rows * groups * len));
        for (auto* t : {&q, &k, &v}) {
          for (float& x : *t) x = normal(rng);
        }
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        std::vector<int8_t> kq(k.size()), vq(v.size());
        std::vector<float> ks(k.size() / 32), vs(v.size() / 32);
        // The values the kernel reads: k and v as the cache holds them.
        if (cache == 1) {
          ToBf16(k.data(), static_cast<int64_t>(k.size()), k16.data());
          ToBf16(v.data(), static_cast<int64_t>(v.size()), v16.data());
          for (size_t i = 0; i < k.size(); ++i) {
            k[i] = Bf16ToFp32(k16[i]);
            v[i] = Bf16ToFp32(v16[i]);
          }
        } else if (cache == 2) {
          for (int64_t j = 0; j < len; ++j) {
            QuantizeKvRow(k.data() + j * d, d, kq.data() + j * d, ks.data() + j * d / 32);
            QuantizeKvRow(v.data() + j * d, d, vq.data() + j * d, vs.data() + j * d / 32);
          }
          for (size_t e = 0; e < k.size(); ++e) {
            k[e] = static_cast<float>(kq[e]) * ks[e / 32];
            v[e] = static_cast<float>(vq[e]) * vs[e / 32];
          }
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        auto run = [&](const float* sinks, float* result) {
          if (cache == 0) {
            DecodeAttentionRows(q.data(), q_stride, rows, groups, k.data(), v.data(), len, d, scale,
                                result, out_stride, scratch.data(), sinks);
          } else if (cache == 1) {
            DecodeAttentionRows(q.data(), q_stride, rows, groups, k16.data(), v16.data(), len, d,
                                scale, result, out_stride, scratch.data(), sinks);
          } else {
            DecodeAttentionRows(q.data(), q_stride, rows, groups, kq.data(), ks.data(), vq.data(),
                                vs.data(), len, d, scale, result, out_stride, scratch.data(),
                                sinks);
          }
        };
        std::vector<float> sinks(static_cast<size_t>(groups));
        for (float& x : sinks) x = 2.0f * normal(rng);
        run(sinks.data(), out.data());
        for (int r = 0; r < rows; ++r) {
          const int64_t row_len = len - (rows - 1) + r;
          for (int g = 0; g < groups; ++g) {
            std::vector<double> p(static_cast<size_t>(row_len));
            double max = sinks[g];
            for (int64_t j = 0; j < row_len; ++j) {
              double dot = 0;
              for (int c = 0; c < d; ++c) dot += double{q[r * q_stride + g * d + c]} * k[j * d + c];
              max = std::max(max, p[j] = dot * scale);
            }
            double total = std::exp(sinks[g] - max);
            for (double& x : p) total += x = std::exp(x - max);
            for (int c = 0; c < d; ++c) {
              double want = 0;
              for (int64_t j = 0; j < row_len; ++j) want += p[j] / total * v[j * d + c];
              ASSERT_NEAR(out[r * out_stride + g * d + c], want, 1e-5)
                  << "row " << r << " group " << g;
            }
          }
        }
        if (cache == 0 && isa == KernelIsa::kPortable) {
          // A sink far below the scores is no sink; one far above leaves almost nothing.
          std::vector<float> none(out.size()), low(out.size()), high(out.size());
          run(nullptr, none.data());
          std::vector<float> lowest(sinks.size(), -1e4f), highest(sinks.size(), 60.0f);
          run(lowest.data(), low.data());
          run(highest.data(), high.data());
          EXPECT_EQ(low, none);
          for (float x : high) ASSERT_LT(std::abs(x), 1e-12f);
        }
      }
    }
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

// QuantizeKvRow: per 32 values, scale max |x| / 127 and q = round(x / scale), so each value
// comes back within half a scale; a block of zeros has scale 0.
TEST(Q8KvCache, RowsRoundTripWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(128);
  for (float& v : x) v = normal(rng);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  std::vector<int8_t> q(x.size());
  std::vector<float> scales(x.size() / 32);
  QuantizeKvRow(x.data(), static_cast<int64_t>(x.size()), q.data(), scales.data());
  EXPECT_EQ(scales[2], 0.0f);
  for (size_t b = 0; b < scales.size(); ++b) {
    const float largest =
        std::abs(*std::max_element(x.begin() + 32 * b, x.begin() + 32 * (b + 1),
                                   [](float a, float c) { return std::abs(a) < std::abs(c); }));
    EXPECT_FLOAT_EQ(scales[b], largest / 127);
  }
  for (size_t e = 0; e < x.size(); ++e) {
    EXPECT_LE(std::abs(static_cast<float>(q[e]) * scales[e / 32] - x[e]), scales[e / 32] / 2 + 1e-6)
        << e;
  }
}

// Attention over a q8_0 cache has the bits of the fp32 path over the cache's values widened
// (q times its scale), on every path, for tokens together and rows whose spans end inside a
// block of 16 positions: the int8 rows are widened in registers, not approximated.
TEST(Q8KvCache, AttentionEqualsTheFp32PathOverTheWidenedCache) {
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    for (auto [rows, groups, len, d] :
         {std::tuple{1, 3, 40, 64}, std::tuple{5, 3, 259, 64}, std::tuple{4, 4, 33, 128},
          std::tuple{2, 1, 7, 32}, std::tuple{3, 2, 10300, 64}}) {
      SCOPED_TRACE(::testing::Message() << KernelIsaName(isa) << " rows " << rows << " groups "
                                        << groups << " len " << len << " d " << d);
      std::mt19937 rng(static_cast<unsigned>(rows * 131 + len));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const int64_t q_stride = groups * d + 8, out_stride = groups * d + 4;
      std::vector<float> q(static_cast<size_t>(rows * q_stride)), k(static_cast<size_t>(len * d)),
          v(k.size()), scratch(static_cast<size_t>(rows * groups * len));
      for (auto* t : {&q, &k, &v}) {
        for (float& x : *t) x = normal(rng);
      }
      std::vector<int8_t> kq(k.size()), vq(v.size());
      std::vector<float> ks(k.size() / 32), vs(v.size() / 32), kw(k.size()), vw(v.size());
      for (int64_t j = 0; j < len; ++j) {
        QuantizeKvRow(k.data() + j * d, d, kq.data() + j * d, ks.data() + j * d / 32);
        QuantizeKvRow(v.data() + j * d, d, vq.data() + j * d, vs.data() + j * d / 32);
      }
      for (size_t e = 0; e < k.size(); ++e) {
        kw[e] = static_cast<float>(kq[e]) * ks[e / 32];
        vw[e] = static_cast<float>(vq[e]) * vs[e / 32];
      }
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      std::vector<float> quantised(static_cast<size_t>(rows * out_stride), -1.0f),
          widened(quantised.size(), -1.0f);
      DecodeAttentionRows(q.data(), q_stride, rows, groups, kq.data(), ks.data(), vq.data(),
                          vs.data(), len, d, scale, quantised.data(), out_stride, scratch.data());
      DecodeAttentionRows(q.data(), q_stride, rows, groups, kw.data(), vw.data(), len, d, scale,
                          widened.data(), out_stride, scratch.data());
      ASSERT_EQ(quantised, widened);
    }
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

}  // namespace
// silu(gate) * up on every path: within 1e-6 (relative) of the double-precision formula, with
// no overflow for gates far out on either side, and rows of a width that is not a multiple of 16.
TEST(SwiGlu, MatchesTheFormulaOnEveryPath) {
  constexpr int64_t kRows = 3, kInter = 37;
  std::vector<float> gate_up(kRows * 2 * kInter);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (float& v : gate_up) v = normal(rng);
  const float extremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.0f, -88.0f, 1e-8f, -1e-8f, 20.0f};
  for (size_t i = 0; i < std::size(extremes); ++i) gate_up[i] = extremes[i];
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    std::vector<float> out(kRows * kInter, -1.0f);
    SwiGlu(gate_up.data(), kRows, kInter, out.data());
    for (int64_t t = 0; t < kRows; ++t) {
      for (int64_t c = 0; c < kInter; ++c) {
        const double g = gate_up[t * 2 * kInter + c], up = gate_up[t * 2 * kInter + kInter + c];
        const double want = g / (1.0 + std::exp(-g)) * up;
        const float got = out[t * kInter + c];
        ASSERT_TRUE(std::isfinite(got)) << KernelIsaName(isa) << " g " << g;
        EXPECT_NEAR(got, want, 1e-6 * std::abs(want) + 1e-30)
            << KernelIsaName(isa) << " row " << t << " column " << c << " g " << g;
      }
    }
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

// gelu(gate) * up (tanh form) on every path, against the double-precision formula: within 1e-5
// (relative), as u = sqrt(2 / pi) (g + 0.044715 g^3) rounds to fp32 and e^-2|u| carries that
// rounding times 2|u|; far negative gates go to 0 without NaNs.
TEST(GeGlu, MatchesTheFormulaOnEveryPath) {
  constexpr int64_t kRows = 3, kInter = 37;
  std::vector<float> gate_up(kRows * 2 * kInter);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : gate_up) v = normal(rng);
  const float extremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 10.0f, -10.0f, 1e-8f, -1e-8f, -3.0f};
  for (size_t i = 0; i < std::size(extremes); ++i) gate_up[i] = extremes[i];
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    std::vector<float> out(kRows * kInter, -1.0f);
    GeGlu(gate_up.data(), kRows, kInter, out.data());
    for (int64_t t = 0; t < kRows; ++t) {
      for (int64_t c = 0; c < kInter; ++c) {
        const double g = gate_up[t * 2 * kInter + c], up = gate_up[t * 2 * kInter + kInter + c];
        const double u = std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g);
        const double want = 0.5 * g * (1.0 + std::tanh(u)) * up;
        const float got = out[t * kInter + c];
        ASSERT_TRUE(std::isfinite(got)) << KernelIsaName(isa) << " g " << g;
        EXPECT_NEAR(got, want, 1e-5 * std::abs(want) + 1e-30)
            << KernelIsaName(isa) << " row " << t << " column " << c << " g " << g;
      }
    }
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

// RMSNorm on every path: within 1e-6 (relative) of the double-precision formula, rows of a width
// that is not a multiple of 16, a row of zeros (eps alone), and each row on its own.
TEST(RmsNorm, MatchesTheFormulaOnEveryPath) {
  constexpr int64_t kRows = 3, kWidth = 37;
  constexpr float kEps = 1e-5f;
  std::vector<float> x(kRows * kWidth), weight(kWidth);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : x) v = normal(rng);
  for (float& v : weight) v = normal(rng);
  std::fill(x.begin() + kWidth, x.begin() + 2 * kWidth, 0.0f);
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    std::vector<float> out(kRows * kWidth, -1.0f);
    RmsNorm(x.data(), kRows, kWidth, weight.data(), kEps, out.data());
    for (int64_t t = 0; t < kRows; ++t) {
      double squares = 0;
      for (int64_t c = 0; c < kWidth; ++c) squares += double{x[t * kWidth + c]} * x[t * kWidth + c];
      const double inverse = 1.0 / std::sqrt(squares / kWidth + kEps);
      for (int64_t c = 0; c < kWidth; ++c) {
        const double want = weight[c] * (x[t * kWidth + c] * inverse);
        EXPECT_NEAR(out[t * kWidth + c], want, 1e-6 * std::abs(want) + 1e-30)
            << KernelIsaName(isa) << " row " << t << " column " << c;
      }
    }
    std::vector<float> last(kWidth, -1.0f);  // The last row alone gives the same values.
    RmsNorm(x.data() + 2 * kWidth, 1, kWidth, weight.data(), kEps, last.data());
    EXPECT_TRUE(std::equal(last.begin(), last.end(), out.begin() + 2 * kWidth))
        << KernelIsaName(isa);
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

// The first largest, as std::max_element, on every path: ties, a maximum in the tail, -inf.
TEST(ArgMax, FirstLargestOnEveryPath) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (KernelIsa isa : kEveryIsa) {
    if (isa > BestKernelIsa()) continue;
    LimitKernelIsa(isa);
    for (int64_t n : {1, 15, 16, 17, 49152}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = normal(rng);
      EXPECT_EQ(ArgMax(x.data(), n), std::max_element(x.begin(), x.end()) - x.begin())
          << KernelIsaName(isa) << " n " << n;
      x[static_cast<size_t>(n - 1)] = 100.0f;  // In the tail.
      EXPECT_EQ(ArgMax(x.data(), n), n - 1) << KernelIsaName(isa);
      if (n > 3) {
        x[1] = 100.0f;  // A tie: the first wins.
        EXPECT_EQ(ArgMax(x.data(), n), 1) << KernelIsaName(isa);
      }
    }
    std::vector<float> low(20, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(ArgMax(low.data(), 20), 0);
  }
  LimitKernelIsa(KernelIsa::kAmx);
}

}  // namespace sluice::llm
