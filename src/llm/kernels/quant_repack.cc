// GGUF's block types repacked at load (RepackQuant): eight rows' blocks interleaved into one record
// so the products read each run's weights four bytes a row in the order of x's steps, each
// record's layout below, and the unpacking of a record's row back to the file's values (the
// portable products and rows read back). quant.cc holds the file layouts and the products.
#include <cstring>

#include "llm/kernels/ggml_blocks.h"
#include "llm/kernels/ggml_grids.h"
#include "llm/kernels/internal.h"

namespace sluice::llm {
namespace kernels::quant {
namespace {

// The 6-bit value of row r's run c in a K-quant record, split by RepackQuant into a nibble (in
// the 32 bytes at `nibbles`) and two high bits (in the 16 at `pairs`): Q4_K's and Q5_K's scales
// at 32 and 96, their mins at 64 and 112; IQ4_XS's scales at 16 and 48.
int RepackedSixBits(const uint8_t* record, int nibbles, int pairs, int r, int c) {
  const int low = (record[nibbles + 8 * (c % 4) + r] >> (4 * (c / 4))) & 0xF;
  const int high = (record[pairs + 8 * (c % 2) + r] >> (2 * (c / 2))) & 3;
  return low | (high << 4);
}

// Group g's (16 weights') 4-bit value in Q2_K's and Q3_K's records (the 64 bytes at `at`).
int RepackedGroupNibble(const uint8_t* record, int at, int r, int g) {
  return (record[at + 8 * (g % 8) + r] >> (4 * (g / 8))) & 0xF;
}

}  // namespace

float RepackedQ2KMin(const uint8_t* record, int r, int g) {
  return Fp16ToFp32(Half(record + 16 + 2 * r)) *
         static_cast<float>(RepackedGroupNibble(record, 96, r, g));
}

namespace {

// Row r's run c in a Q2_K or Q3_K record, as UnpackChunk gives it from the file's block.
void UnpackRepackedLowK(uint32_t type, const uint8_t* record, int r, int c, Chunk* out) {
  const bool q3 = static_cast<GgmlType>(type) == GgmlType::kQ3_K;
  const uint8_t* run = record + RepackedHeader(type) + RepackedRunBytes(type) * c;
  const float d = Fp16ToFp32(Half(record + 2 * r));
  out->bias = out->bias2 = 0;
  for (int h = 0; h < 2; ++h) {
    const int g = 2 * c + h;
    if (q3) {
      const int high = (record[80 + 8 * (g % 4) + r] >> (2 * (g / 4))) & 3;
      out->scale[h] =
          d * static_cast<float>((RepackedGroupNibble(record, 16, r, g) | (high << 4)) - 32);
    } else {
      out->scale[h] = d * static_cast<float>(RepackedGroupNibble(record, 32, r, g));
    }
  }
  if (!q3) {
    out->bias = -RepackedQ2KMin(record, r, 2 * c);
    out->bias2 = -RepackedQ2KMin(record, r, 2 * c + 1) - out->bias;
  }
  for (int s = 0; s < 8; ++s) {
    for (int b = 0; b < 4; ++b) {
      int q = (run[32 * (s / 4) + 4 * r + b] >> (2 * (s % 4))) & 3;
      if (q3) q |= ((run[64 + 4 * r + b] >> s) & 1) << 2;
      out->q[4 * s + b] = static_cast<int8_t>(q3 ? q - 4 : q);
    }
  }
}

// Row r's run c in an IQ3_S record, as UnpackChunk gives it from the file's block.
void UnpackRepackedIq3S(const uint8_t* record, int r, int c, Chunk* out) {
  const uint8_t* run = record + RepackedHeader(static_cast<uint32_t>(GgmlType::kIQ3_S)) +
                       RepackedRunBytes(static_cast<uint32_t>(GgmlType::kIQ3_S)) * c;
  const int scale = (record[16 + 8 * (c % 4) + r] >> (4 * (c / 4))) & 0xF;
  out->scale[0] = out->scale[1] =
      Fp16ToFp32(Half(record + 2 * r)) * static_cast<float>(1 + 2 * scale);
  out->bias = 0;
  for (int s = 0; s < 8; ++s) {
    const uint32_t entry = kIq3sGrid[run[8 * s + r] | (((run[64 + r] >> s) & 1) << 8)];
    for (int b = 0; b < 4; ++b) {
      const int l = 4 * s + b, magnitude = static_cast<int>((entry >> (8 * b)) & 0xFF);
      out->q[l] =
          static_cast<int8_t>((run[72 + 8 * (l / 8) + r] >> (l % 8)) & 1 ? -magnitude : magnitude);
    }
  }
}

// Row r's run c in an IQ2_XS record, as UnpackChunk gives it from the file's block.
void UnpackRepackedIq2Xs(const uint8_t* record, int r, int c, Chunk* out) {
  const uint8_t* run = record + RepackedHeader(static_cast<uint32_t>(GgmlType::kIQ2_XS)) +
                       RepackedRunBytes(static_cast<uint32_t>(GgmlType::kIQ2_XS)) * c;
  Iq2XsHalfScales(Half(record + 2 * r), record[16 + 8 * c + r], out->scale);
  out->bias = 0;
  for (int t = 0; t < 4; ++t) UnpackIq2XsWord(Half(run + 16 * t + 2 * r), out->q + 8 * t);
}

// Row r's run c in a K-quant record (one super-block of eight rows), as UnpackChunk gives it.
void UnpackRepackedK(uint32_t type, const uint8_t* record, int r, int c, Chunk* out) {
  const auto kind = static_cast<GgmlType>(type);
  const uint8_t* run = record + RepackedHeader(type) + RepackedRunBytes(type) * c;
  out->bias = 0;
  if (kind == GgmlType::kIQ3_S) return UnpackRepackedIq3S(record, r, c, out);
  if (kind == GgmlType::kIQ2_XS) return UnpackRepackedIq2Xs(record, r, c, out);
  if (kind == GgmlType::kQ6_K) {
    const float d = Fp16ToFp32(Half(record + 2 * r));
    for (int h = 0; h < 2; ++h) {
      const auto sc = static_cast<int8_t>(record[16 + 16 * c + 8 * h + r]);
      out->scale[h] = d * static_cast<float>(sc);
    }
  } else if (kind == GgmlType::kIQ4_XS) {
    const float d = Fp16ToFp32(Half(record + 2 * r));
    out->scale[0] = out->scale[1] =
        d * static_cast<float>(RepackedSixBits(record, 16, 48, r, c) - 32);
  } else if (kind == GgmlType::kQ2_K || kind == GgmlType::kQ3_K) {
    return UnpackRepackedLowK(type, record, r, c, out);
  } else {
    const float d = Fp16ToFp32(Half(record + 2 * r)), dmin = Fp16ToFp32(Half(record + 16 + 2 * r));
    out->scale[0] = out->scale[1] = d * static_cast<float>(RepackedSixBits(record, 32, 96, r, c));
    out->bias = -dmin * static_cast<float>(RepackedSixBits(record, 64, 112, r, c));
  }
  for (int s = 0; s < 8; ++s) {
    for (int b = 0; b < 4; ++b) {
      int q = (run[32 * (s % 4) + 4 * r + b] >> (4 * (s / 4))) & 0xF;
      if (kind == GgmlType::kIQ4_XS) q = kIq4Levels[q];
      if (kind == GgmlType::kQ5_K) q |= ((run[128 + 4 * r + b] >> s) & 1) << 4;
      if (kind == GgmlType::kQ6_K) {
        q |= ((run[128 + 32 * (s / 4) + 4 * r + b] >> (2 * (s % 4))) & 3) << 4;
        q -= 32;
      }
      out->q[4 * s + b] = static_cast<int8_t>(q);
    }
  }
}

}  // namespace

void UnpackRepacked(uint32_t type, const uint8_t* record, int r, int c, Chunk* out) {
  const auto kind = static_cast<GgmlType>(type);
  out->bias2 = 0;
  if (BlockElements(type) == 256) return UnpackRepackedK(type, record, r, c, out);
  if (kind == GgmlType::kQ5_0 || kind == GgmlType::kQ5_1) {  // Nibbles, then fifth bits.
    const uint8_t* run = record + RepackedHeader(type);
    out->scale[0] = out->scale[1] = Fp16ToFp32(Half(record + 2 * r));
    out->bias = kind == GgmlType::kQ5_1 ? Fp16ToFp32(Half(record + 16 + 2 * r)) : 0.0f;
    for (int s = 0; s < 8; ++s) {
      for (int b = 0; b < 4; ++b) {
        const int q = ((run[32 * (s % 4) + 4 * r + b] >> (4 * (s / 4))) & 0xF) |
                      (((run[128 + 4 * r + b] >> s) & 1) << 4);
        out->q[4 * s + b] = static_cast<int8_t>(q - (kind == GgmlType::kQ5_0 ? 16 : 0));
      }
    }
    return;
  }
  const uint8_t* bytes = record + RepackedHeader(type);
  out->scale[0] = out->scale[1] =
      kind == GgmlType::kMXFP4 ? E8m0Half(record[r]) : Fp16ToFp32(Half(record + 2 * r));
  out->bias = kind == GgmlType::kQ4_1 ? Fp16ToFp32(Half(record + 16 + 2 * r)) : 0.0f;
  for (int s = 0; s < 4; ++s) {
    for (int b = 0; b < 4; ++b) {
      if (kind == GgmlType::kQ8_0) {
        out->q[4 * s + b] = static_cast<int8_t>(bytes[32 * s + 4 * r + b]);
        out->q[16 + 4 * s + b] = static_cast<int8_t>(bytes[32 * (s + 4) + 4 * r + b]);
      } else if (kind == GgmlType::kIQ4_NL || kind == GgmlType::kMXFP4) {
        const int8_t* levels = kind == GgmlType::kMXFP4 ? kMxfp4Levels : kIq4Levels;
        const uint8_t byte = bytes[32 * s + 4 * r + b];
        out->q[4 * s + b] = levels[byte & 0xF];
        out->q[16 + 4 * s + b] = levels[byte >> 4];
      } else {
        const int offset = kind == GgmlType::kQ4_0 ? 8 : 0;
        const uint8_t byte = bytes[32 * s + 4 * r + b];
        out->q[4 * s + b] = static_cast<int8_t>((byte & 0xF) - offset);
        out->q[16 + 4 * s + b] = static_cast<int8_t>((byte >> 4) - offset);
      }
    }
  }
}

}  // namespace kernels::quant

// Every block type the products read has a repacked record.
bool CanRepackQuant(uint32_t ggml_type, int64_t rows) {
  return IsQuantType(ggml_type) && rows % 8 == 0;
}

namespace {

// The K-quants' records (RepackQuant): one per eight rows and super-block of 256 columns, in the
// eight blocks' bytes.
//   Q4_K, Q5_K  d of row r (fp16) at 2 r, dmin at 16 + 2 r; the 6-bit scales of the runs c split
//               into their low nibbles, at 32 + 8 (c % 4) + r, nibble c / 4, and their high two
//               bits, at 96 + 8 (c % 2) + r, bits 2 (c / 2); the mins the same at 64 and 112;
//               from 128, run c's 128 bytes of nibbles as Q4_0's repacked vectors (byte 4 r + b
//               of vector p: weight 4 p + b low, 16 + 4 p + b high), and Q5_K's 32 bytes of fifth
//               bits after them (byte 4 r + b, bit s: weight 4 s + b). Runs of 128 or 160 bytes.
//   Q6_K        d of row r at 2 r; the signed scale of run c's half h at 16 + 16 c + 8 h + r; from
//               144, runs of 192 bytes: the low nibbles as Q4_K's, then two vectors of high bit
//               pairs (vector u, byte 4 r + b, bits 2 (s % 4): weight 4 s + b, s = 4 u + s % 4).
//   Q2_K        d of row r at 2 r, dmin at 16 + 2 r; the 4-bit scale of its group g (16 weights)
//               at 32 + 8 (g % 8) + r, nibble g / 8, the min the same at 96; from 160, runs of
//               64 bytes: two vectors of bit pairs (vector u, byte 4 r + b, bits 2 (s % 4):
//               weight 4 s + b, s = 4 u + s % 4).
//   Q3_K        d of row r at 2 r; group g's 6-bit scale (before less 32): its nibble at 16 +
//               8 (g % 8) + r, nibble g / 8, its high pair at 80 + 8 (g % 4) + r, bits 2 (g / 4);
//               from 112, runs of 96 bytes: Q2_K's bit pairs of q + 4 (0..7), then its third bits
//               (byte 4 r + b, bit s: weight 4 s + b).
//   IQ4_XS      d of row r at 2 r; the runs' 6-bit scales (before less 32) split as Q4_K's, the
//               nibbles at 16 and the high pairs at 48; from 64, runs of 128 bytes holding the
//               nibbles (indices into the 16 levels) as IQ4_NL's repacked record does.
//   IQ3_S       d of row r at 2 r; run c's 4-bit scale at 16 + 8 (c % 4) + r, nibble c / 4; from
//               48, runs of 104 bytes: the low byte of step s's grid index (weights 4 s .. 4 s +
//               3) at 8 s + r, so that one gather of eight entries makes a step's vector; the
//               run's ninth bits at 64 + r (bit s for step s); its 32 sign bits at 72 + 4 r.
//   IQ2_XS      d of row r at 2 r; run c's scale byte (two 4-bit scales) at 16 + 8 c + r; from 80,
//               runs of 64 bytes: the run's word t (weights 8 t .. 8 t + 7: grid index and signs)
//               at 16 t + 2 r, so that one load makes eight rows' indices for steps 2 t, 2 t + 1.
// A run's weights then come from one place four bytes a row at a time, in the order of x's steps,
// and a super-block's 64 scales and mins unpack with a few vector operations.
void RepackKBlocks(GgmlType kind, const uint8_t* blocks[8], uint8_t* record) {
  const auto type = static_cast<uint32_t>(kind);
  const int header = kernels::quant::RepackedHeader(type);
  const int run_bytes = kernels::quant::RepackedRunBytes(type);
  std::memset(record, 0, static_cast<size_t>(header + 8 * run_bytes));
  for (int r = 0; r < 8; ++r) {
    const uint8_t* block = blocks[r];
    if (kind == GgmlType::kQ2_K || kind == GgmlType::kQ3_K) {
      const bool q3 = kind == GgmlType::kQ3_K;
      std::memcpy(record + 2 * r, block + (q3 ? 108 : 80), 2);
      if (!q3) std::memcpy(record + 16 + 2 * r, block + 82, 2);
      for (int g = 0; g < 16; ++g) {
        const int shift = 4 * (g / 8);
        if (q3) {
          const int low = g < 8 ? block[96 + g] & 0xF : block[96 + g - 8] >> 4;
          const int high = (block[104 + g % 4] >> (2 * (g / 4))) & 3;
          record[16 + 8 * (g % 8) + r] |= static_cast<uint8_t>(low << shift);
          record[80 + 8 * (g % 4) + r] |= static_cast<uint8_t>(high << (2 * (g / 4)));
        } else {
          record[32 + 8 * (g % 8) + r] |= static_cast<uint8_t>((block[g] & 0xF) << shift);
          record[96 + 8 * (g % 8) + r] |= static_cast<uint8_t>((block[g] >> 4) << shift);
        }
      }
      for (int c = 0; c < 8; ++c) {
        kernels::quant::Chunk chunk;
        kernels::quant::UnpackChunk(type, block, c, &chunk);
        uint8_t* run = record + header + run_bytes * c;
        for (int s = 0; s < 8; ++s) {
          for (int b = 0; b < 4; ++b) {
            const int q = chunk.q[4 * s + b] + (q3 ? 4 : 0);  // Q3_K's q - 4 + 4: 0..7.
            run[32 * (s / 4) + 4 * r + b] |= static_cast<uint8_t>((q & 3) << (2 * (s % 4)));
            if (q3) run[64 + 4 * r + b] |= static_cast<uint8_t>((q >> 2) << s);
          }
        }
      }
      continue;
    }
    if (kind == GgmlType::kIQ3_S) {
      std::memcpy(record + 2 * r, block, 2);
      for (int c = 0; c < 8; ++c) {
        const int scale = (block[106 + c / 2] >> (4 * (c % 2))) & 0xF;
        record[16 + 8 * (c % 4) + r] |= static_cast<uint8_t>(scale << (4 * (c / 4)));
        uint8_t* run = record + header + run_bytes * c;
        for (int s = 0; s < 8; ++s) run[8 * s + r] = block[2 + 8 * c + s];
        run[64 + r] = block[66 + c];
        for (int t = 0; t < 4; ++t) run[72 + 8 * t + r] = block[74 + 4 * c + t];
      }
      continue;
    }
    if (kind == GgmlType::kIQ2_XS) {
      std::memcpy(record + 2 * r, block, 2);
      for (int c = 0; c < 8; ++c) {
        record[16 + 8 * c + r] = block[66 + c];
        for (int t = 0; t < 4; ++t) {
          std::memcpy(record + header + run_bytes * c + 16 * t + 2 * r, block + 2 + 8 * c + 2 * t,
                      2);
        }
      }
      continue;
    }
    if (kind == GgmlType::kIQ4_XS) {
      std::memcpy(record + 2 * r, block, 2);
      const int high = block[2] | (block[3] << 8);
      for (int c = 0; c < 8; ++c) {
        const int low = (block[4 + c / 2] >> (4 * (c % 2))) & 0xF;
        record[16 + 8 * (c % 4) + r] |= static_cast<uint8_t>(low << (4 * (c / 4)));
        record[48 + 8 * (c % 2) + r] |=
            static_cast<uint8_t>(((high >> (2 * c)) & 3) << (2 * (c / 2)));
        for (int v = 0; v < 4; ++v) {
          std::memcpy(record + header + run_bytes * c + 32 * v + 4 * r, block + 8 + 16 * c + 4 * v,
                      4);
        }
      }
      continue;
    }
    if (kind == GgmlType::kQ6_K) {
      std::memcpy(record + 2 * r, block + 208, 2);
      for (int c = 0; c < 8; ++c) {
        for (int h = 0; h < 2; ++h) record[16 + 16 * c + 8 * h + r] = block[192 + 2 * c + h];
      }
    } else {
      std::memcpy(record + 2 * r, block, 2);
      std::memcpy(record + 16 + 2 * r, block + 2, 2);
      for (int c = 0; c < 8; ++c) {
        int scale = 0, min = 0;
        kernels::quant::ScaleMin(block + 4, c, &scale, &min);
        record[32 + 8 * (c % 4) + r] |= static_cast<uint8_t>((scale & 0xF) << (4 * (c / 4)));
        record[64 + 8 * (c % 4) + r] |= static_cast<uint8_t>((min & 0xF) << (4 * (c / 4)));
        record[96 + 8 * (c % 2) + r] |= static_cast<uint8_t>((scale >> 4) << (2 * (c / 2)));
        record[112 + 8 * (c % 2) + r] |= static_cast<uint8_t>((min >> 4) << (2 * (c / 2)));
      }
    }
    for (int c = 0; c < 8; ++c) {
      kernels::quant::Chunk chunk;
      kernels::quant::UnpackChunk(type, block, c, &chunk);
      uint8_t* run = record + header + run_bytes * c;
      for (int s = 0; s < 8; ++s) {
        for (int b = 0; b < 4; ++b) {
          // The unsigned code: Q6_K's q + 32 (6 bits), Q5_K's 5 bits, Q4_K's 4.
          const int q = chunk.q[4 * s + b] + (kind == GgmlType::kQ6_K ? 32 : 0);
          run[32 * (s % 4) + 4 * r + b] |= static_cast<uint8_t>((q & 0xF) << (4 * (s / 4)));
          if (kind == GgmlType::kQ5_K) {
            run[128 + 4 * r + b] |= static_cast<uint8_t>(((q >> 4) & 1) << s);
          } else if (kind == GgmlType::kQ6_K) {
            run[128 + 32 * (s / 4) + 4 * r + b] |=
                static_cast<uint8_t>(((q >> 4) & 3) << (2 * (s % 4)));
          }
        }
      }
    }
  }
}

}  // namespace

// Record (g, c), eight rows' run c, 8 blocks' bytes: the rows' d (fp16) at 2 r (MXFP4's E8M0 byte
// at r); Q4_1's m at 16 + 2 r; then 4 vectors of 32 bytes (Q4_0, Q4_1, IQ4_NL: byte 4 r + b of
// vector p is row r's byte 4 p + b of its 16, whose low nibble is weight 4 p + b and high nibble
// weight 16 + 4 p + b; MXFP4's the same) or 8 (Q8_0: byte 4 r + b of vector s is row r's weight 4 s
// + b).
void RepackQuant(uint32_t ggml_type, const void* w, int64_t n, int64_t k, void* out) {
  const auto kind = static_cast<GgmlType>(ggml_type);
  const int64_t block_bytes = kernels::quant::BlockBytes(ggml_type);
  const int64_t row_bytes = QuantRowBytes(ggml_type, k), record_bytes = 8 * block_bytes;
  const int header = kernels::quant::RepackedHeader(ggml_type);
  const int vectors = kind == GgmlType::kQ8_0 ? 8 : 4;
  // Where a block's weights start.
  const int quants = kind == GgmlType::kQ4_1 ? 4 : kind == GgmlType::kMXFP4 ? 1 : 2;
  const auto* from = static_cast<const uint8_t*>(w);
  auto* to = static_cast<uint8_t*>(out);
  if (kind == GgmlType::kQ5_0 || kind == GgmlType::kQ5_1) {
    // As Q4_0's and Q4_1's records, with the eight rows' fifth bits after the nibbles (byte 4 r +
    // b, bit s: weight 4 s + b), as a Q5_K record's run.
    for (int64_t g = 0; g < n / 8; ++g) {
      for (int64_t c = 0; c < k / 32; ++c) {
        uint8_t* record = to + g * 8 * row_bytes + c * record_bytes;
        std::memset(record, 0, static_cast<size_t>(record_bytes));
        for (int r = 0; r < 8; ++r) {
          const uint8_t* block = from + (8 * g + r) * row_bytes + c * block_bytes;
          std::memcpy(record + 2 * r, block, 2);
          if (kind == GgmlType::kQ5_1) std::memcpy(record + 16 + 2 * r, block + 2, 2);
          kernels::quant::Chunk chunk;
          kernels::quant::UnpackChunk(ggml_type, block, 0, &chunk);
          uint8_t* run = record + header;
          for (int s = 0; s < 8; ++s) {
            for (int b = 0; b < 4; ++b) {
              const int q = chunk.q[4 * s + b] + (kind == GgmlType::kQ5_0 ? 16 : 0);
              run[32 * (s % 4) + 4 * r + b] |= static_cast<uint8_t>((q & 0xF) << (4 * (s / 4)));
              run[128 + 4 * r + b] |= static_cast<uint8_t>(((q >> 4) & 1) << s);
            }
          }
        }
      }
    }
    return;
  }
  if (kernels::quant::BlockElements(ggml_type) == 256) {
    for (int64_t g = 0; g < n / 8; ++g) {
      for (int64_t c = 0; c < k / 256; ++c) {
        const uint8_t* blocks[8];
        for (int r = 0; r < 8; ++r) blocks[r] = from + (8 * g + r) * row_bytes + c * block_bytes;
        RepackKBlocks(kind, blocks, to + g * 8 * row_bytes + c * record_bytes);
      }
    }
    return;
  }
  for (int64_t g = 0; g < n / 8; ++g) {
    for (int64_t c = 0; c < k / 32; ++c) {
      uint8_t* record = to + g * 8 * row_bytes + c * record_bytes;
      for (int r = 0; r < 8; ++r) {
        const uint8_t* block = from + (8 * g + r) * row_bytes + c * block_bytes;
        if (kind == GgmlType::kMXFP4) {
          record[r] = block[0];
        } else {
          std::memcpy(record + 2 * r, block, 2);
        }
        if (kind == GgmlType::kQ4_1) std::memcpy(record + 16 + 2 * r, block + 2, 2);
        for (int v = 0; v < vectors; ++v) {
          std::memcpy(record + header + 32 * v + 4 * r, block + quants + 4 * v, 4);
        }
      }
    }
  }
}

void DequantizeRepackedRow(uint32_t ggml_type, const void* w, int64_t k, int64_t row, float* out) {
  const int64_t per_block = kernels::quant::BlockElements(ggml_type) / 32;
  const int64_t record = 8 * kernels::quant::BlockBytes(ggml_type);
  const auto* group = static_cast<const uint8_t*>(w) + row / 8 * (k / 32 / per_block * record);
  kernels::quant::Chunk chunk;
  for (int64_t c = 0; c < k; c += 32) {
    const int64_t b = c / 32;
    kernels::quant::UnpackRepacked(ggml_type, group + b / per_block * record,
                                   static_cast<int>(row % 8), static_cast<int>(b % per_block),
                                   &chunk);
    // Q2_K's second half: its own min (chunk.bias2 holds it less the first's, rounded).
    const float second_bias = ggml_type == static_cast<uint32_t>(GgmlType::kQ2_K)
                                  ? -kernels::quant::RepackedQ2KMin(
                                        group + b / per_block * record, static_cast<int>(row % 8),
                                        static_cast<int>(2 * (b % per_block) + 1))
                                  : chunk.bias;
    for (int l = 0; l < 32; ++l) {
      out[c + l] = chunk.scale[l / 16] * static_cast<float>(chunk.q[l]) +
                   (l < 16 ? chunk.bias : second_bias);
    }
  }
}

}  // namespace sluice::llm
