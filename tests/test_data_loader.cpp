// The loader beyond one stream: sequence packing (document boundaries, positions, labels, splitting and
// padding), blending by weight, sharding with packing, the background reader (same batches, exact
// position, errors reach the caller), exact resume in the middle of a split document, and
// reverse-complement augmentation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/token_source.hpp"
#include "data/tokenizer.hpp"
#include "data_test_util.hpp"

using dtest::data_error;
using dtest::TempDir;
using mxt::Batch;
using mxt::BatchLoader;
using mxt::Corpus;
using mxt::DatasetConfig;
using mxt::DataPosition;
using mxt::detail::TokenSource;
using ::testing::HasSubstr;

namespace {

// Documents whose tokens are all distinct: document d holds base_d, base_d + 1, ...
struct Docs {
  std::vector<std::vector<int32_t>> docs;
  std::map<int32_t, std::pair<int, int>> where;  // token -> (document, index)
};

Docs make_docs(const std::vector<int>& lens, int32_t first = 0) {
  Docs d;
  int32_t t = first;
  for (size_t k = 0; k < lens.size(); ++k) {
    d.docs.emplace_back();
    for (int i = 0; i < lens[k]; ++i) {
      d.where[t] = {static_cast<int>(k), i};
      d.docs.back().push_back(t++);
    }
  }
  return d;
}

Corpus::Source source_of(const Docs& d, const std::string& name = "docs", double weight = 1) {
  mxt::detail::TokenBuffer buf(mxt::TokenDType::I32);
  std::vector<int64_t> ends;
  for (const auto& doc : d.docs) {
    buf.append(doc.data(), doc.size());
    ends.push_back(static_cast<int64_t>(buf.size()));
  }
  Corpus::Source s;
  s.name = name;
  s.weight = weight;
  s.parts.push_back(TokenSource::from_buffer(name, std::move(buf), ends));
  return s;
}

Corpus corpus_of(const Docs& d) { return Corpus(std::vector<Corpus::Source>{source_of(d)}); }

DatasetConfig packed_cfg(int64_t S, int64_t stride = 0, int64_t mbs = 1, bool shuffle = false, int64_t prefetch = 0) {
  DatasetConfig c;
  c.max_seq_length = S;
  c.stride = stride;
  c.micro_batch_size = mbs;
  c.shuffle = shuffle;
  c.prefetch = prefetch;
  c.sequence_packing = true;
  return c;
}

struct Row {
  std::vector<int32_t> ids, labels, pos, doc;
};
Row row(const Batch& b, int64_t r) {
  auto slice = [&](const std::vector<int32_t>& v) {
    return std::vector<int32_t>(v.begin() + r * b.seq, v.begin() + (r + 1) * b.seq);
  };
  return {slice(b.input_ids), slice(b.labels), slice(b.positions), b.doc_ids.empty() ? std::vector<int32_t>{} : slice(b.doc_ids)};
}
Row next_row(BatchLoader& l) {
  Batch b;
  l.next(b);
  return row(b, 0);
}

}  // namespace

// ------------------------------------------------------------------------------------------------ packing

TEST(DataPacking, DocumentsBackToBackWithPositionsDocIdsAndLabels) {
  const Docs d = make_docs({3, 5, 2, 6});
  BatchLoader l(corpus_of(d), packed_cfg(8), 1, 0, 1);
  EXPECT_EQ(l.num_windows(), 4);
  const Row r0 = next_row(l);
  EXPECT_EQ(r0.ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r0.pos, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 4}));
  EXPECT_EQ(r0.doc, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(r0.labels, (std::vector<int32_t>{1, 2, -100, 4, 5, 6, 7, -100}));  // never across documents
  const Row r1 = next_row(l);
  EXPECT_EQ(r1.ids, (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(r1.pos, (std::vector<int32_t>{0, 1, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r1.labels, (std::vector<int32_t>{9, -100, 11, 12, 13, 14, 15, -100}));
  EXPECT_EQ(l.position(), (DataPosition{0, 4, 0}));
  EXPECT_EQ(next_row(l).ids, r0.ids);  // epoch 1, same order unshuffled
  EXPECT_EQ(l.epoch(), 1);
}

TEST(DataPacking, SplitDocumentContinuesInTheNextRow) {
  const Docs d = make_docs({5, 5, 5});
  BatchLoader l(corpus_of(d), packed_cfg(8), 1, 0, 1);
  const Row r0 = next_row(l);
  EXPECT_EQ(r0.ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r0.labels, (std::vector<int32_t>{1, 2, 3, 4, -100, 6, 7, 8}));  // the head keeps its true next token
  EXPECT_EQ(r0.doc, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(l.position(), (DataPosition{0, 1, 3}));  // 3 tokens of unit 1 given out
  const Row r1 = next_row(l);
  EXPECT_EQ(r1.ids, (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14, 0}));
  EXPECT_EQ(r1.pos, (std::vector<int32_t>{0, 1, 0, 1, 2, 3, 4, 0}));  // the tail starts at position 0
  EXPECT_EQ(r1.doc, (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(r1.labels, (std::vector<int32_t>{9, -100, 11, 12, 13, 14, -100, 1}));
}

TEST(DataPacking, WithoutSplittingTheRowIsPadded) {
  const Docs d = make_docs({5, 5, 8}, 10);
  DatasetConfig c = packed_cfg(8);
  c.split_samples_in_token_packing = false;
  c.pad_token_id = 1;
  BatchLoader l(corpus_of(d), c, 1, 0, 1);
  const Row r0 = next_row(l);
  EXPECT_EQ(r0.ids, (std::vector<int32_t>{10, 11, 12, 13, 14, 1, 1, 1}));
  EXPECT_EQ(r0.labels, (std::vector<int32_t>{11, 12, 13, 14, -100, -100, -100, -100}));
  EXPECT_EQ(r0.doc, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1}));  // padding is its own document
  EXPECT_EQ(r0.pos, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(next_row(l).ids, (std::vector<int32_t>{15, 16, 17, 18, 19, 1, 1, 1}));
  EXPECT_EQ(next_row(l).ids, (std::vector<int32_t>{20, 21, 22, 23, 24, 25, 26, 27}));
  EXPECT_EQ(l.offset(), 0);
}

TEST(DataPacking, LongDocumentsAreCutIntoOverlappingChunks) {
  const Docs d = make_docs({20, 3});
  BatchLoader l(corpus_of(d), packed_cfg(8, 2), 1, 0, 1);  // step 6: chunks [0,8) [6,14) [12,20) of doc 0
  EXPECT_EQ(l.num_windows(), 4);
  EXPECT_EQ(next_row(l).ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  const Row r1 = next_row(l);
  EXPECT_EQ(r1.ids, (std::vector<int32_t>{6, 7, 8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(r1.labels.back(), -100);
  EXPECT_EQ(next_row(l).ids, (std::vector<int32_t>{12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(next_row(l).ids, (std::vector<int32_t>{20, 21, 22, 0, 1, 2, 3, 4}));
}

TEST(DataPacking, RowsConcatenateToWholeDocumentsWhateverTheSplits) {
  std::mt19937 rng(5);
  std::vector<int> lens;
  for (int i = 0; i < 300; ++i) lens.push_back(1 + static_cast<int>(rng() % 32));  // <= S: one chunk each
  const Docs d = make_docs(lens);
  BatchLoader l(corpus_of(d), packed_cfg(32, 0, 3, true, 2), 11, 0, 1);
  std::vector<int32_t> stream, labels;
  Batch b;
  for (int i = 0; i < 60; ++i) {
    l.next(b);
    for (int64_t r = 0; r < b.batch; ++r) {
      const Row row_r = row(b, r);
      for (int64_t t = 0; t < b.seq; ++t) {
        // A position 0 starts a new piece: its doc id changes (or the row starts).
        if (t > 0) EXPECT_EQ(row_r.pos[t] == 0, row_r.doc[t] != row_r.doc[t - 1]);
        // Labels: the next token of the same document, or -100 at its end.
        const auto [doc, idx] = d.where.at(row_r.ids[t]);
        const int32_t want = idx + 1 < lens[doc] ? d.docs[doc][idx + 1] : -100;
        EXPECT_EQ(row_r.labels[t], want);
      }
      stream.insert(stream.end(), row_r.ids.begin(), row_r.ids.end());
    }
  }
  // Walk the stream: every document appears whole, in order, whatever the row boundaries were (a document
  // of length 1 gives no chunk: it has nothing to predict).
  size_t at = 0, docs_seen = 0;
  while (at < stream.size()) {
    const auto [doc, idx] = d.where.at(stream[at]);
    ASSERT_EQ(idx, 0) << "a piece starts inside a document at " << at;
    for (int i = 0; i < lens[doc] && at < stream.size(); ++i, ++at) ASSERT_EQ(stream[at], d.docs[doc][i]);
    ++docs_seen;
  }
  EXPECT_GT(docs_seen, 200u);
}

TEST(DataPacking, ShardsDisjointAcrossRanks) {
  const Docs d = make_docs(std::vector<int>(60, 4));  // 60 chunks of 4: 20 per rank of 3, 5 rows of 16
  std::set<int32_t> seen;
  for (int r = 0; r < 3; ++r) {
    BatchLoader l(corpus_of(d), packed_cfg(16, 0, 1, true, 1), 3, r, 3);
    EXPECT_EQ(l.windows_per_epoch(), 20);
    for (int i = 0; i < 5; ++i)
      for (int32_t t : next_row(l).ids) EXPECT_TRUE(seen.insert(t).second) << "rank " << r << " token " << t;
    EXPECT_EQ(l.position(), (DataPosition{0, 20, 0}));
  }
  EXPECT_EQ(seen.size(), 240u);  // every token of every document exactly once per epoch
}

TEST(DataPacking, ResumeExactlyInsideASplitDocument) {
  std::vector<int> lens;
  for (int i = 0; i < 80; ++i) lens.push_back(3 + (i * 7) % 11);
  const Docs d = make_docs(lens);
  const DatasetConfig c = packed_cfg(16, 0, 2, true, 3);
  BatchLoader a(corpus_of(d), c, 21, 1, 2);
  Batch b;
  DataPosition pos;
  int guard = 0;
  do {
    a.next(b);
    pos = a.position();
  } while (pos.offset == 0 && ++guard < 100);
  ASSERT_GT(pos.offset, 0) << "no row ended inside a document";
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 40; ++i) {  // across an epoch boundary too
    a.next(b);
    want.push_back(b.input_ids);
    want.push_back(b.doc_ids);
  }
  BatchLoader r(corpus_of(d), c, 21, 1, 2);
  r.next(b);  // a running reader, then moved
  r.set_position(pos);
  EXPECT_EQ(r.position(), pos);
  for (int i = 0; i < 40; ++i) {
    r.next(b);
    EXPECT_EQ(b.input_ids, want[2 * i]) << "batch " << i;
    EXPECT_EQ(b.doc_ids, want[2 * i + 1]) << "batch " << i;
  }
  EXPECT_EQ(r.position(), a.position());
  EXPECT_THROW(r.set_position(DataPosition{0, 0, 1000}), mxt::DataError);  // past the end of the unit
}

// ------------------------------------------------------------------------------------------------ prefetch

TEST(DataPrefetch, SameBatchesAndPositionsAsReadingInTheStep) {
  std::vector<int> lens;
  for (int i = 0; i < 120; ++i) lens.push_back(2 + (i * 13) % 29);
  const Docs d = make_docs(lens);
  for (bool packing : {false, true}) {
    DatasetConfig c = packed_cfg(24, 4, 2, true, 0);
    c.sequence_packing = packing;
    BatchLoader sync(corpus_of(d), c, 8, 0, 1);
    c.prefetch = 5;
    BatchLoader ahead(corpus_of(d), c, 8, 0, 1);
    Batch x, y;
    for (int i = 0; i < 100; ++i) {
      sync.next(x);
      ahead.next(y);
      ASSERT_EQ(x.input_ids, y.input_ids) << "batch " << i << " packing " << packing;
      ASSERT_EQ(x.labels, y.labels);
      ASSERT_EQ(x.positions, y.positions);
      ASSERT_EQ(x.doc_ids, y.doc_ids);
      ASSERT_EQ(sync.position(), ahead.position());  // the position of what was handed out
    }
    EXPECT_GE(ahead.wait_seconds(), 0.0);
  }
}

TEST(DataPrefetch, AnErrorReadAheadReachesTheCallerEveryTime) {
  std::vector<int32_t> t(400, 7);
  t[333] = 999;  // outside a vocabulary of 256
  Corpus::Source s;
  s.name = "bad";
  s.parts.push_back(TokenSource::from_tokens("bad-tokens", t));
  s.parts[0]->set_limit(256);
  DatasetConfig c = packed_cfg(10, 0, 1, false, 4);
  c.sequence_packing = false;
  BatchLoader l(Corpus(std::vector<Corpus::Source>{s}), c, 1, 0, 1);
  Batch b;
  for (int i = 0; i < 33; ++i) l.next(b);  // windows [0, 330) are fine
  EXPECT_THAT(data_error([&] { l.next(b); }), HasSubstr("bad-tokens' document 1, token offset 333: token 999"));
  EXPECT_THAT(data_error([&] { l.next(b); }), HasSubstr("token 999"));
  EXPECT_EQ(l.position(), (DataPosition{0, 33, 0}));
  l.set_position(0, 0);  // a reset restarts the reader
  l.next(b);
  EXPECT_EQ(b.input_ids[0], 7);
}

// ------------------------------------------------------------------------------------------------ blending

TEST(DataBlend, SourcesInterleaveByWeightAndStayInStepAcrossRanks) {
  const Docs a = make_docs({1000}), b = make_docs({1000}, 5000);
  DatasetConfig c = packed_cfg(4, 0, 1, true, 2);
  c.sequence_packing = false;
  const Corpus corpus(std::vector<Corpus::Source>{source_of(a, "a", 3), source_of(b, "b", 1)});
  std::vector<BatchLoader> ranks;
  for (int r = 0; r < 2; ++r) ranks.emplace_back(corpus, c, 4, r, 2);
  EXPECT_EQ(ranks[0].num_windows(), 500);
  EXPECT_EQ(ranks[0].windows_per_epoch(), 250);
  int from_a = 0;
  std::set<int32_t> a_seen;
  for (int k = 1; k <= 400; ++k) {
    const Row r0 = next_row(ranks[0]), r1 = next_row(ranks[1]);
    const bool a0 = r0.ids[0] < 5000, a1 = r1.ids[0] < 5000;
    EXPECT_EQ(a0, a1) << "ranks read different sources at step " << k;
    from_a += a0;
    EXPECT_LE(std::abs(from_a - 0.75 * k), 1.0) << "step " << k;
    if (a0 && k <= 160) {  // source a: 125 windows per rank per epoch; its first 120 reads are in epoch 0
      EXPECT_TRUE(a_seen.insert(r0.ids[0]).second);
      EXPECT_TRUE(a_seen.insert(r1.ids[0]).second);
    }
  }
  EXPECT_EQ(from_a, 300);
}

TEST(DataBlend, TooSmallSourceIsNamed) {
  const Docs a = make_docs({100}), b = make_docs({5}, 500);
  DatasetConfig c = packed_cfg(8, 0, 1, true, 0);
  c.sequence_packing = false;
  const Corpus corpus(std::vector<Corpus::Source>{source_of(a, "big"), source_of(b, "tiny")});
  EXPECT_THAT(data_error([&] { BatchLoader(corpus, c, 1, 0, 1); }),
              HasSubstr("dataset source 'tiny' has 5 tokens, fewer than one window of 8"));
}

// ------------------------------------------------------------------------------------------------ augmentation

TEST(DataAugment, ReverseComplementIsDeterministicAndPerEpoch) {
  std::string genome;
  std::mt19937 rng(2);
  for (int i = 0; i < 4000; ++i) genome += "ACGT"[rng() % 4];
  const std::vector<int32_t> tokens(genome.begin(), genome.end());
  DatasetConfig c = packed_cfg(16, 0, 1, false, 2);
  c.sequence_packing = false;
  c.tokenizer = "nucleotide";
  const mxt::detail::Tokenizer tok("nucleotide", true);
  c.reverse_complement_prob = 1.0;
  BatchLoader all(tokens, c, 3, 0, 1);
  for (int w = 0; w < 20; ++w) {
    std::vector<int32_t> want(tokens.begin() + w * 16, tokens.begin() + (w + 1) * 16);
    tok.reverse_complement(want.data(), 16);
    EXPECT_EQ(next_row(all).ids, want) << "window " << w;
  }
  c.reverse_complement_prob = 0.5;
  BatchLoader x(tokens, c, 3, 0, 1), y(tokens, c, 3, 0, 1);
  int flipped = 0, differ_across_epochs = 0;
  std::vector<std::vector<int32_t>> epoch0;
  for (int w = 0; w < 250; ++w) {
    const Row rx = next_row(x);
    EXPECT_EQ(rx.ids, next_row(y).ids);
    flipped += rx.ids != std::vector<int32_t>(tokens.begin() + w * 16, tokens.begin() + (w + 1) * 16);
    epoch0.push_back(rx.ids);
  }
  for (int w = 0; w < 250; ++w) differ_across_epochs += next_row(x).ids != epoch0[w];
  EXPECT_GT(flipped, 90);
  EXPECT_LT(flipped, 160);
  EXPECT_GT(differ_across_epochs, 90);  // a fresh draw every epoch
}

// ------------------------------------------------------------------------------------------------ files

TEST(DataLoaderFiles, IndexedDatasetWindowsAreTheStream) {
  TempDir d;
  std::string fa;
  for (int i = 0; i < 40; ++i) fa += ">r" + std::to_string(i) + "\n" + std::string(10 + i, "ACGT"[i % 4]) + "\n";
  mxt::PreprocessOptions p;
  p.inputs = {d.write("g.fa", fa)};
  p.output_prefix = d.path("g");
  mxt::run_preprocess(p);
  DatasetConfig c;
  c.source = "mmidx";
  c.paths = {d.path("g")};
  c.max_seq_length = 32;
  c.stride = 8;
  c.shuffle = false;
  c.prefetch = 2;
  const Corpus corpus = mxt::open_corpus(c, 256);
  DatasetConfig f = c;
  f.source = "fasta";
  f.paths = {d.path("g.fa")};
  const std::vector<int32_t> stream = mxt::load_tokens(f, 256);
  ASSERT_EQ(corpus.num_tokens(), static_cast<int64_t>(stream.size()));
  BatchLoader l(corpus, c, 1, 0, 1);
  for (int w = 0; w < l.num_windows(); ++w)
    EXPECT_EQ(next_row(l).ids, std::vector<int32_t>(stream.begin() + w * 24, stream.begin() + w * 24 + 32));
  BatchLoader small(mxt::open_corpus(c, 60), c, 1, 0, 1);  // tokens are checked as they are read
  Batch b;
  EXPECT_THAT(data_error([&] { small.next(b); }), HasSubstr("is not a token id in [0, 60)"));
}
