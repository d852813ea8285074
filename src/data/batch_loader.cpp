// Rows from units, and the background reader.
//
// Windows (no packing): S = max_seq_length tokens of a source's stream starting at 0, step, 2*step, ... with
//   step = S - stride, so consecutive windows share `stride` tokens (HF tokenizers' overflow stride). Only
//   full windows: a partial tail is dropped rather than padded. labels mirror HF causal LM: input_ids shifted
//   by one inside the row, labels[S-1] = -100.
// Packing (use_sequence_packing): every document is cut into chunks of at most S tokens starting at 0, step,
//   ... (the last one shorter), and chunks are laid into rows back to back. Each chunk restarts positions at
//   0 and gets its own doc id within the row; labels stay inside the chunk (its last token: -100). A chunk
//   that does not fit the rest of a row is split and its tail starts the next row, like the recipe's
//   TokenPackingDataset(split_samples=True); with split_samples_in_token_packing=false the row is padded
//   instead (pad id, label -100, its own doc id). The head of a split chunk keeps the true next-token label.
// Order, sharding, blending: unit_order.hpp. Reverse-complement augmentation (nucleotides): a unit is read
//   reverse-complemented with probability p, drawn from (seed, source, source epoch, unit): reproducible.
// Background reader: a thread builds up to dataset.prefetch micro-batches ahead. Batches carry the position
//   after them; the loader reports the position of the batches handed out, so a checkpoint taken between
//   steps resumes exactly. An error while reading ahead is raised by the next() that reaches it.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "data/token_source.hpp"
#include "data/tokenizer.hpp"
#include "data/unit_order.hpp"
#include "mxtrain/data.hpp"

namespace mxt {

using detail::TokenSource;

namespace {

// One source's parts as one list of documents / one stream, and its units.
class SourceView {
 public:
  SourceView(const Corpus::Source& s, int64_t S, int64_t step, bool packing)
      : name_(s.name), parts_(s.parts), S_(S), step_(step), packing_(packing) {
    part_tok_.push_back(0);
    part_doc_.push_back(0);
    for (const auto& p : parts_) {
      part_tok_.push_back(part_tok_.back() + p->total_tokens());
      part_doc_.push_back(part_doc_.back() + p->num_docs());
    }
    if (!packing_) {
      const int64_t L = part_tok_.back();
      units_ = L >= S_ ? (L - S_) / step_ + 1 : 0;
      return;
    }
    chunk_prefix_.reserve(static_cast<size_t>(part_doc_.back() + 1));
    chunk_prefix_.push_back(0);
    for (const auto& p : parts_)
      for (int64_t d = 0; d < p->num_docs(); ++d) {
        const int64_t L = p->doc_len(d);
        const int64_t chunks = L < 2 ? 0 : 1 + (L > S_ ? (L - S_ + step_ - 1) / step_ : 0);
        chunk_prefix_.push_back(chunk_prefix_.back() + chunks);
      }
    units_ = chunk_prefix_.back();
  }

  const std::string& name() const { return name_; }
  int64_t units() const { return units_; }
  int64_t tokens() const { return part_tok_.back(); }

  // Unit u's tokens into out (room for S); returns its length.
  int64_t read_unit(int64_t u, int32_t* out) const {
    if (!packing_) {
      read_stream(u * step_, S_, out);
      return S_;
    }
    const int64_t d = std::upper_bound(chunk_prefix_.begin(), chunk_prefix_.end(), u) - chunk_prefix_.begin() - 1;
    const size_t p = static_cast<size_t>(std::upper_bound(part_doc_.begin(), part_doc_.end(), d) -
                                         part_doc_.begin() - 1);
    const int64_t local = d - part_doc_[p];
    const int64_t off = (u - chunk_prefix_[d]) * step_;
    const int64_t len = std::min(S_, parts_[p]->doc_len(local) - off);
    parts_[p]->read_doc(local, off, len, out);
    return len;
  }

 private:
  void read_stream(int64_t at, int64_t n, int32_t* out) const {
    size_t p = static_cast<size_t>(std::upper_bound(part_tok_.begin(), part_tok_.end(), at) - part_tok_.begin() - 1);
    while (n > 0) {
      const int64_t take = std::min(n, part_tok_[p + 1] - at);
      if (take > 0) parts_[p]->read_stream(at - part_tok_[p], take, out);
      out += take, at += take, n -= take;
      ++p;
    }
  }

  std::string name_;
  std::vector<std::shared_ptr<TokenSource>> parts_;
  std::vector<int64_t> part_tok_, part_doc_;  // cumulative tokens / documents over parts
  std::vector<int64_t> chunk_prefix_;         // packing: cumulative chunks over documents
  int64_t S_, step_, units_ = 0;
  bool packing_;
};

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void check_settings(const DatasetConfig& c, int rank, int world) {
  const int64_t S = c.max_seq_length;
  if (S < 2) throw ConfigError("dataset.max_seq_length=" + std::to_string(S) + ": expected at least 2");
  if (c.stride < 0 || c.stride >= S)
    throw ConfigError("dataset.stride=" + std::to_string(c.stride) + ": expected 0 <= stride < max_seq_length (" +
                      std::to_string(S) + ")");
  if (c.micro_batch_size < 1)
    throw ConfigError("dataset.micro_batch_size=" + std::to_string(c.micro_batch_size) + ": expected >= 1");
  if (c.prefetch < 0) throw ConfigError("dataset.prefetch=" + std::to_string(c.prefetch) + ": expected >= 0");
  if (c.sequence_packing && !c.split_samples_in_token_packing && c.pad_token_id < 0)
    throw ConfigError("use_sequence_packing without splitting documents pads rows: set dataset.pad_token_id");
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("BatchLoader: rank " + std::to_string(rank) + " of world " + std::to_string(world));
}

std::vector<SourceView> make_views(const Corpus& corpus, const DatasetConfig& c, int world) {
  const int64_t S = c.max_seq_length, step = S - c.stride;
  std::vector<SourceView> views;
  for (const auto& s : corpus.sources()) {
    views.emplace_back(s, S, step, c.sequence_packing);
    const SourceView& v = views.back();
    const std::string what = corpus.sources().size() == 1 ? "dataset (" + v.name() + ")" : "dataset source '" + v.name() + "'";
    if (v.units() == 0)
      throw DataError(what + (c.sequence_packing ? " has no document of 2 or more tokens"
                                                 : " has " + std::to_string(v.tokens()) +
                                                       " tokens, fewer than one window of " + std::to_string(S)));
    if (v.units() < world)
      throw DataError(what + " has " + std::to_string(v.units()) +
                      (c.sequence_packing ? " document chunks" : " windows of " + std::to_string(S) + " tokens") +
                      ", fewer than the " + std::to_string(world) + " data-parallel ranks");
  }
  return views;
}

std::vector<int64_t> unit_counts(const std::vector<SourceView>& v) {
  std::vector<int64_t> n;
  for (const auto& s : v) n.push_back(s.units());
  return n;
}

std::vector<double> source_weights(const Corpus& corpus) {
  std::vector<double> w;
  for (const auto& s : corpus.sources()) w.push_back(s.weight);
  return w;
}

// Builds batches in order from a position; not thread-safe (one owner at a time).
class Engine {
 public:
  Engine(const Corpus& corpus, const DatasetConfig& c, uint64_t seed, int rank, int world)
      : cfg_(c),
        seed_(seed),
        views_(make_views(corpus, c, world)),
        order_(unit_counts(views_), source_weights(corpus), c.shuffle, seed, rank, world),
        unit_(static_cast<size_t>(c.max_seq_length)) {
    if (c.reverse_complement_prob > 0) rc_tok_ = std::make_unique<detail::Tokenizer>("nucleotide", c.uppercase);
  }

  int64_t per_epoch() const { return order_.per_epoch(); }
  int64_t total_units() const { return order_.total_units(); }
  const DataPosition& position() const { return pos_; }

  void set_position(DataPosition p) {
    const int64_t per = per_epoch();
    if (p.epoch < 0 || p.cursor < 0 || p.cursor > per || p.offset < 0)
      throw DataError("BatchLoader::set_position(" + std::to_string(p.epoch) + ", " + std::to_string(p.cursor) +
                      ", " + std::to_string(p.offset) + "): cursor must be in [0, " + std::to_string(per) +
                      "] and epoch, offset >= 0");
    if (p.offset > 0) {
      if (!cfg_.sequence_packing)
        throw DataError("BatchLoader::set_position: offset " + std::to_string(p.offset) +
                        " is only meaningful with use_sequence_packing");
      pos_ = p;
      wrap();
      const int64_t len = load_unit();
      if (pos_.offset >= len)
        throw DataError("BatchLoader::set_position: offset " + std::to_string(p.offset) + " is past the end of unit " +
                        std::to_string(pos_.cursor) + " (" + std::to_string(len) + " tokens)");
    }
    pos_ = p;
  }

  void next(Batch& out) {
    const int64_t S = cfg_.max_seq_length, B = cfg_.micro_batch_size;
    out.batch = B;
    out.seq = S;
    out.input_ids.resize(B * S);
    out.labels.resize(B * S);
    out.positions.resize(B * S);
    if (cfg_.sequence_packing)
      out.doc_ids.resize(B * S);
    else
      out.doc_ids.clear();
    for (int64_t b = 0; b < B; ++b) {
      int32_t* ids = out.input_ids.data() + b * S;
      int32_t* lab = out.labels.data() + b * S;
      int32_t* pos = out.positions.data() + b * S;
      if (cfg_.sequence_packing)
        packed_row(ids, lab, pos, out.doc_ids.data() + b * S);
      else
        window_row(ids, lab, pos);
    }
  }

 private:
  // Lazy wrap: the cursor may sit at the end of an epoch until the next read (as the position API shows).
  void wrap() {
    if (pos_.cursor >= per_epoch()) {
      ++pos_.epoch;
      pos_.cursor = 0;
    }
  }
  int64_t read_index() const { return pos_.epoch * per_epoch() + pos_.cursor; }

  // The unit at the current position into unit_ (kept while a split unit spans two rows).
  int64_t load_unit() {
    const int64_t p = read_index();
    if (p == unit_p_) return unit_len_;
    const detail::UnitOrder::Ref r = order_.at(p);
    unit_len_ = views_[r.src].read_unit(r.unit, unit_.data());
    if (rc_tok_) {
      uint64_t h = mix64(seed_ ^ 0x52435F4155474D31ull);  // "RC_AUGM1"
      h = mix64(h ^ static_cast<uint64_t>(r.src));
      h = mix64(h ^ static_cast<uint64_t>(r.src_epoch));
      h = mix64(h ^ static_cast<uint64_t>(r.unit));
      if (static_cast<double>(h >> 11) * 0x1.0p-53 < cfg_.reverse_complement_prob)
        rc_tok_->reverse_complement(unit_.data(), unit_len_);
    }
    unit_p_ = p;
    return unit_len_;
  }

  void window_row(int32_t* ids, int32_t* lab, int32_t* pos) {
    const int64_t S = cfg_.max_seq_length;
    wrap();
    load_unit();
    ++pos_.cursor;
    for (int64_t i = 0; i < S; ++i) {
      ids[i] = unit_[i];
      lab[i] = i + 1 < S ? unit_[i + 1] : -100;
      pos[i] = static_cast<int32_t>(i);
    }
  }

  void packed_row(int32_t* ids, int32_t* lab, int32_t* pos, int32_t* doc) {
    const int64_t S = cfg_.max_seq_length;
    int64_t filled = 0;
    int32_t doc_id = 0;
    while (filled < S) {
      wrap();
      const int64_t len = load_unit();
      const int64_t off = pos_.offset, room = S - filled;
      if (len - off > room && !cfg_.split_samples_in_token_packing) {  // pad the rest (off is 0 here)
        for (int64_t i = 0; i < room; ++i) {
          ids[filled + i] = static_cast<int32_t>(cfg_.pad_token_id);
          lab[filled + i] = -100;
          pos[filled + i] = static_cast<int32_t>(i);
          doc[filled + i] = doc_id;
        }
        return;
      }
      const int64_t take = std::min(len - off, room);
      for (int64_t i = 0; i < take; ++i) {
        ids[filled + i] = unit_[off + i];
        lab[filled + i] = off + i + 1 < len ? unit_[off + i + 1] : -100;
        pos[filled + i] = static_cast<int32_t>(i);
        doc[filled + i] = doc_id;
      }
      filled += take;
      ++doc_id;
      pos_.offset += take;
      if (pos_.offset == len) {
        ++pos_.cursor;
        pos_.offset = 0;
      }
    }
  }

  DatasetConfig cfg_;
  uint64_t seed_;
  std::vector<SourceView> views_;
  detail::UnitOrder order_;
  std::unique_ptr<detail::Tokenizer> rc_tok_;
  std::vector<int32_t> unit_;
  int64_t unit_p_ = -1, unit_len_ = 0;
  DataPosition pos_;
};

}  // namespace

struct BatchLoader::Impl {
  struct Item {
    Batch batch;
    DataPosition after;
    std::exception_ptr error;
  };

  Impl(Corpus corpus, const DatasetConfig& c, uint64_t seed, int rank, int world)
      : engine(corpus, c, seed, rank, world), depth(static_cast<size_t>(c.prefetch)) {}
  ~Impl() { halt(); }

  void start() {
    stop = false;
    running = true;
    worker = std::thread([this] { produce(); });
  }
  void halt() {
    if (!running) return;
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
    running = false;
    ready.clear();
  }

  void produce() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || ready.size() < depth; });
        if (stop) return;
      }
      Item it;
      try {
        engine.next(it.batch);
        it.after = engine.position();
      } catch (...) {
        it.error = std::current_exception();
      }
      const bool failed = static_cast<bool>(it.error);
      {
        std::lock_guard<std::mutex> lk(mu);
        ready.push_back(std::move(it));
      }
      cv.notify_all();
      if (failed) return;  // the error stays at the queue's head for every later next()
    }
  }

  void next(Batch& out) {
    if (depth == 0) {
      engine.next(out);
      consumed = engine.position();
      return;
    }
    if (!running) start();
    const auto t0 = std::chrono::steady_clock::now();
    Item it;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !ready.empty(); });
      if (ready.front().error) std::rethrow_exception(ready.front().error);
      it = std::move(ready.front());
      ready.pop_front();
    }
    cv.notify_all();
    wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::swap(out, it.batch);
    consumed = it.after;
  }

  void set_position(const DataPosition& p) {
    halt();
    engine.set_position(p);
    consumed = p;
  }

  Engine engine;
  size_t depth;
  DataPosition consumed;
  double wait_s = 0;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> ready;
  bool stop = false, running = false;
};

BatchLoader::BatchLoader(Corpus corpus, const DatasetConfig& cfg, uint64_t seed, int rank, int world) {
  check_settings(cfg, rank, world);
  impl_ = std::make_unique<Impl>(std::move(corpus), cfg, seed, rank, world);
}
BatchLoader::~BatchLoader() = default;
BatchLoader::BatchLoader(BatchLoader&&) noexcept = default;
BatchLoader& BatchLoader::operator=(BatchLoader&&) noexcept = default;

void BatchLoader::next(Batch& out) { impl_->next(out); }
int64_t BatchLoader::num_windows() const { return impl_->engine.total_units(); }
int64_t BatchLoader::windows_per_epoch() const { return impl_->engine.per_epoch(); }
DataPosition BatchLoader::position() const { return impl_->consumed; }
double BatchLoader::wait_seconds() const { return impl_->wait_s; }
void BatchLoader::set_position(int64_t epoch, int64_t cursor, int64_t offset) {
  impl_->set_position(DataPosition{epoch, cursor, offset});
}

}  // namespace mxt
