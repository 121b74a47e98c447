// Tidepool for C++17: soft memory in the shape of Midas's interface (SoftPool, SoftUniquePtr,
// SoftArray, SoftMap) and far memory (FarVector, FarBlock, Region), as header-only wrappers
// over the C ABI in tidepool.h.
//
//   #include <tidepool.hpp>
//   tidepool::SoftArray<Block> cache(n, [](size_t i) { return read_from_storage(i); });
//   Block b = cache.read(7);   // rebuilt by the lambda if soft memory was taken back
//
// Errors are thrown as tidepool::Error (a std::runtime_error carrying the C status). An
// exception thrown by a reconstructor is carried through the C layer and rethrown from the
// read that called it. Handles are move-only; each frees its C object when destroyed.
//
// Values kept in soft memory are copied in and out, never referenced in place (soft memory may
// be taken back at any moment): T must be trivially copyable, except for SoftMap, whose keys and
// values may also be std::string or std::vector of trivially copyable elements.
#ifndef TIDEPOOL_HPP
#define TIDEPOOL_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tidepool.h"

namespace tidepool {

/// A failed call: the C status and tp_last_error()'s message.
class Error : public std::runtime_error {
public:
    Error(tp_status status, const std::string &what) : std::runtime_error(what), status_(status) {}
    tp_status status() const noexcept { return status_; }

private:
    tp_status status_;
};

namespace detail {

/// Throws on an error status; returns the status otherwise (TP_OK, TP_NOT_FOUND, TP_MISMATCH).
inline tp_status check(tp_status s, const char *what);

/// The exception a reconstructor threw, rethrown once the C call that ran it returns.
inline std::exception_ptr &pending() {
    thread_local std::exception_ptr e;
    return e;
}

inline tp_status check(tp_status s, const char *what) {
    if (std::exception_ptr e = std::exchange(pending(), nullptr)) {
        std::rethrow_exception(e);
    }
    if (s < 0) {
        throw Error(s, std::string(what) + ": " + tp_last_error());
    }
    return s;
}

template <typename P> P *made(P *p, const char *what) {
    if (p == nullptr) {
        throw Error(TP_EINVAL, std::string(what) + ": " + tp_last_error());
    }
    return p;
}

/// A C handle freed by `Free` when the owner goes.
template <typename H, void (*Free)(H *)> struct Deleter {
    void operator()(H *h) const noexcept { Free(h); }
};
template <typename H, void (*Free)(H *)> using Handle = std::unique_ptr<H, Deleter<H, Free>>;

/// Runs a reconstructor, turning an exception into an error code for the C side.
template <typename F> int run_reconstructor(F &&f) noexcept {
    try {
        f();
        return 0;
    } catch (...) {
        pending() = std::current_exception();
        return -1;
    }
}

template <typename T> constexpr bool plain = std::is_trivially_copyable_v<T>;

/// How a SoftMap key or value becomes bytes and back.
template <typename T, typename = void> struct Codec {
    static_assert(plain<T>, "SoftMap keys and values: trivially copyable, std::string or "
                            "std::vector of trivially copyable elements");
    static const void *data(const T &v) { return &v; }
    static size_t size(const T &) { return sizeof(T); }
    static T decode(const std::vector<uint8_t> &b) {
        T v;
        if (b.size() != sizeof(T)) {
            throw Error(TP_EINVAL, "a soft value has the wrong size for its type");
        }
        std::memcpy(&v, b.data(), sizeof(T));
        return v;
    }
};

template <> struct Codec<std::string> {
    static const void *data(const std::string &v) { return v.data(); }
    static size_t size(const std::string &v) { return v.size(); }
    static std::string decode(const std::vector<uint8_t> &b) {
        return std::string(b.begin(), b.end());
    }
};

template <typename U> struct Codec<std::vector<U>, std::enable_if_t<plain<U>>> {
    static const void *data(const std::vector<U> &v) { return v.data(); }
    static size_t size(const std::vector<U> &v) { return v.size() * sizeof(U); }
    static std::vector<U> decode(const std::vector<uint8_t> &b) {
        std::vector<U> v(b.size() / sizeof(U));
        std::memcpy(v.data(), b.data(), v.size() * sizeof(U));
        return v;
    }
};

template <typename T> void append(tp_buf *out, const T &v) {
    check(tp_buf_append(out, Codec<T>::data(v), Codec<T>::size(v)), "tp_buf_append");
}

/// Reads a value of unknown length: one try with a stack buffer, then one of the exact size.
template <typename F> std::optional<std::vector<uint8_t>> read_bytes(F &&get, const char *what) {
    std::vector<uint8_t> buf(256);
    size_t len = 0;
    tp_status s = get(buf.data(), buf.size(), &len);
    if (s == TP_ETOOSMALL) {
        buf.resize(len);
        s = get(buf.data(), buf.size(), &len);
    }
    if (check(s, what) == TP_NOT_FOUND) {
        return std::nullopt;
    }
    buf.resize(len);
    return buf;
}

} // namespace detail

/// Hits, misses and reconstructions of a pool, map or array.
using Stats = tp_stats;

/// Soft memory: a budget of memory whose objects may be taken back at any moment and are
/// rebuilt on their next read. `Arena::global()` follows the machine's free memory.
class Arena {
public:
    /// An arena of `budget` bytes (0: 256 MiB); with `automatic`, the budget follows free
    /// memory: it grows into idle memory and is cut at once under pressure.
    explicit Arena(size_t budget = 0, bool automatic = true)
        : h_(detail::made(tp_arena_new(budget, automatic ? 1 : 0), "tp_arena_new")) {}

    /// The process's default arena (automatic budget), made on first use.
    static Arena &global() {
        static Arena arena;
        return arena;
    }

    /// Sets the budget in bytes (memory beyond it is taken back at once).
    void set_budget(size_t bytes) {
        detail::check(tp_arena_set_budget(h_.get(), bytes), "tp_arena_set_budget");
    }

    const tp_arena *get() const noexcept { return h_.get(); }

private:
    detail::Handle<tp_arena, tp_arena_free> h_;
};

template <typename T, typename... ReconArgs> class SoftUniquePtr;

/// Objects of type T rebuilt by one reconstructor from the arguments each read passes
/// (Midas's SoftMemPool).
template <typename T, typename... ReconArgs> class SoftPool {
    static_assert(detail::plain<T>, "soft pool objects must be trivially copyable");

public:
    using Reconstructor = std::function<T(ReconArgs...)>;

    explicit SoftPool(Reconstructor reconstructor, Arena &arena = Arena::global())
        : state_(std::make_shared<State>(std::move(reconstructor))),
          h_(detail::made(tp_soft_pool_new(arena.get(), sizeof(T), &SoftPool::trampoline,
                                            state_.get()),
                          "tp_soft_pool_new")) {}

    /// A new object: its first read builds it with the reconstructor.
    SoftUniquePtr<T, ReconArgs...> new_unique() {
        return SoftUniquePtr<T, ReconArgs...>(
            detail::made(tp_soft_box_new(h_.get()), "tp_soft_box_new"), state_);
    }

    Stats stats() const {
        Stats s{};
        detail::check(tp_soft_pool_stats(h_.get(), &s), "tp_soft_pool_stats");
        return s;
    }

private:
    friend class SoftUniquePtr<T, ReconArgs...>;
    struct State {
        explicit State(Reconstructor f) : reconstruct(std::move(f)) {}
        Reconstructor reconstruct;
    };

    static int trampoline(void *user, const void *args, void *out, size_t size) {
        return detail::run_reconstructor([&] {
            auto *state = static_cast<State *>(user);
            const auto &tuple = *static_cast<const std::tuple<ReconArgs...> *>(args);
            T v = std::apply(state->reconstruct, tuple);
            std::memcpy(out, &v, size);
        });
    }

    // The callback's state outlives the pool while any of its objects lives.
    std::shared_ptr<State> state_;
    detail::Handle<tp_soft_pool, tp_soft_pool_free> h_;
};

/// Midas's name for a pool.
template <typename T, typename... ReconArgs> using SoftMemPool = SoftPool<T, ReconArgs...>;

/// One soft object (Midas's SoftUniquePtr): read it with the arguments that rebuild it.
template <typename T, typename... ReconArgs> class SoftUniquePtr {
public:
    /// The value, rebuilt from `args` by the pool's reconstructor if it vanished.
    T read(ReconArgs... args) const {
        std::tuple<ReconArgs...> tuple(std::move(args)...);
        T out;
        detail::check(tp_soft_box_read(h_.get(), &tuple, &out), "SoftUniquePtr::read");
        return out;
    }

    void write(const T &value) {
        detail::check(tp_soft_box_write(h_.get(), &value), "SoftUniquePtr::write");
    }

    /// Sets the value to `desired` if it is `expected` (compared bytewise), atomically. False
    /// if it held something else, or had vanished (a read rebuilds it).
    bool cmpxchg(const T &expected, const T &desired) {
        return detail::check(tp_soft_box_cmpxchg(h_.get(), &expected, &desired),
                             "SoftUniquePtr::cmpxchg") == TP_OK;
    }

private:
    friend class SoftPool<T, ReconArgs...>;
    using State = typename SoftPool<T, ReconArgs...>::State;
    SoftUniquePtr(tp_soft_box *h, std::shared_ptr<State> state)
        : state_(std::move(state)), h_(h) {}

    std::shared_ptr<State> state_;
    detail::Handle<tp_soft_box, tp_soft_box_free> h_;
};

/// A fixed-size array in soft memory, each element rebuilt from its index (Midas's
/// SoftArray).
template <typename T> class SoftArray {
    static_assert(detail::plain<T>, "soft array elements must be trivially copyable");

public:
    using Reconstructor = std::function<T(size_t)>;

    SoftArray(size_t size, Reconstructor reconstructor, Arena &arena = Arena::global())
        : state_(std::make_unique<Reconstructor>(std::move(reconstructor))),
          h_(detail::made(tp_soft_array_new(arena.get(), size, &SoftArray::trampoline,
                                            state_.get()),
                          "tp_soft_array_new")) {}

    /// Element `idx`, rebuilt by the reconstructor if it vanished.
    T read(size_t idx) const {
        T out;
        size_t len = 0;
        detail::check(tp_soft_array_get(h_.get(), idx, &out, sizeof(T), &len), "SoftArray::read");
        return out;
    }

    void write(size_t idx, const T &value) {
        detail::check(tp_soft_array_set(h_.get(), idx, &value, sizeof(T)), "SoftArray::write");
    }

    /// Sets element `idx` to `desired` if it is `expected` (compared bytewise), atomically.
    bool cmpxchg(size_t idx, const T &expected, const T &desired) {
        return detail::check(tp_soft_array_cmpxchg(h_.get(), idx, &expected, sizeof(T), &desired,
                                                   sizeof(T)),
                             "SoftArray::cmpxchg") == TP_OK;
    }

    size_t size() const noexcept { return tp_soft_array_len(h_.get()); }

    Stats stats() const {
        Stats s{};
        detail::check(tp_soft_array_stats(h_.get(), &s), "tp_soft_array_stats");
        return s;
    }

private:
    static int trampoline(void *user, size_t index, tp_buf *out) {
        return detail::run_reconstructor([&] {
            T v = (*static_cast<Reconstructor *>(user))(index);
            detail::check(tp_buf_append(out, &v, sizeof(T)), "tp_buf_append");
        });
    }

    std::unique_ptr<Reconstructor> state_;
    detail::Handle<tp_soft_array, tp_soft_array_free> h_;
};

/// A hash map whose values live in soft memory (the keys stay in normal memory). Without a
/// reconstructor a value taken back is simply gone; with one, it is rebuilt on its next get.
template <typename K, typename V> class SoftMap {
public:
    using Reconstructor = std::function<V(const K &)>;

    explicit SoftMap(Arena &arena = Arena::global())
        : h_(detail::made(tp_soft_map_new(arena.get(), nullptr, nullptr), "tp_soft_map_new")) {}

    explicit SoftMap(Reconstructor reconstructor, Arena &arena = Arena::global())
        : state_(std::make_unique<Reconstructor>(std::move(reconstructor))),
          h_(detail::made(tp_soft_map_new(arena.get(), &SoftMap::trampoline, state_.get()),
                          "tp_soft_map_new")) {}

    /// The value for `key` (rebuilt if there is a reconstructor), or nothing.
    std::optional<V> get(const K &key) const {
        auto bytes = detail::read_bytes(
            [&](void *out, size_t cap, size_t *len) {
                return tp_soft_map_get(h_.get(), detail::Codec<K>::data(key),
                                       detail::Codec<K>::size(key), out, cap, len);
            },
            "SoftMap::get");
        if (!bytes) {
            return std::nullopt;
        }
        return detail::Codec<V>::decode(*bytes);
    }

    void put(const K &key, const V &value) {
        detail::check(tp_soft_map_insert(h_.get(), detail::Codec<K>::data(key),
                                         detail::Codec<K>::size(key),
                                         detail::Codec<V>::data(value),
                                         detail::Codec<V>::size(value)),
                      "SoftMap::put");
    }

    /// Removes `key`; true if it was there.
    bool remove(const K &key) {
        return detail::check(tp_soft_map_remove(h_.get(), detail::Codec<K>::data(key),
                                                detail::Codec<K>::size(key)),
                             "SoftMap::remove") == TP_OK;
    }

    /// Keys held (some of whose values may have been taken back since).
    size_t size() const noexcept { return tp_soft_map_len(h_.get()); }

    Stats stats() const {
        Stats s{};
        detail::check(tp_soft_map_stats(h_.get(), &s), "tp_soft_map_stats");
        return s;
    }

private:
    static int trampoline(void *user, const uint8_t *key, size_t key_len, tp_buf *out) {
        return detail::run_reconstructor([&] {
            K k = detail::Codec<K>::decode(std::vector<uint8_t>(key, key + key_len));
            detail::append(out, (*static_cast<Reconstructor *>(user))(k));
        });
    }

    std::unique_ptr<Reconstructor> state_;
    detail::Handle<tp_soft_map, tp_soft_map_free> h_;
};

// ---- far memory ------------------------------------------------------------------------

/// A far store: "local:", "node://tenant:token@host:port", "redis://host:port",
/// "redis+cluster://h1:p1,h2:p2", "memcached://host:port". Shared by every thread.
class Far {
public:
    explicit Far(const std::string &url = "local:")
        : h_(detail::made(tp_far_open(url.c_str()), "tp_far_open")) {}
    const tp_far *get() const noexcept { return h_.get(); }

private:
    detail::Handle<tp_far, tp_far_free> h_;
};

/// How a section maps lines to slots.
enum class Structure { Direct, SetAssociative, FullyAssociative };

/// A local cache of far lines, for one access pattern (Mira's cache sections). A section and
/// the far data cached in it belong to the thread that made the section.
class Section {
public:
    /// `capacity` bytes in lines of `line_bytes` (a multiple of 8); `ways` for set-associative.
    Section(Structure structure, size_t line_bytes, size_t capacity, size_t ways = 4)
        : h_(detail::made(tp_section_new(c_structure(structure), ways, line_bytes, capacity),
                          "tp_section_new")) {}

    tp_section_stats stats() const {
        tp_section_stats s{};
        detail::check(tp_section_stats_get(h_.get(), &s), "tp_section_stats_get");
        return s;
    }

    const tp_section *get() const noexcept { return h_.get(); }

private:
    static tp_structure c_structure(Structure s) {
        switch (s) {
        case Structure::Direct: return TP_DIRECT;
        case Structure::SetAssociative: return TP_SET_ASSOCIATIVE;
        default: return TP_FULLY_ASSOCIATIVE;
        }
    }
    detail::Handle<tp_section, tp_section_free> h_;
};

/// A vector of T in far memory, cached in a section (zeros until written).
template <typename T> class FarVector {
    static_assert(detail::plain<T>, "far vector elements must be trivially copyable");

public:
    FarVector(const Far &far, const Section &section, size_t size)
        : h_(detail::made(tp_far_vec_new(far.get(), section.get(), sizeof(T), size),
                          "tp_far_vec_new")) {}

    T get(size_t idx) const {
        T out;
        read(idx, 1, &out);
        return out;
    }
    T operator[](size_t idx) const { return get(idx); }

    void set(size_t idx, const T &value) { write(idx, 1, &value); }

    /// Copies `count` elements from `first` to `out`, in one round trip for missing lines.
    void read(size_t first, size_t count, T *out) const {
        detail::check(tp_far_vec_read(h_.get(), first, count, out), "FarVector::read");
    }

    /// Copies `count` elements from `src` to `first` on (whole lines are not fetched).
    void write(size_t first, size_t count, const T *src) {
        detail::check(tp_far_vec_write(h_.get(), first, count, src), "FarVector::write");
    }

    /// Writes changed lines back to the far store.
    void flush() { detail::check(tp_far_vec_flush(h_.get()), "FarVector::flush"); }

    size_t size() const noexcept { return tp_far_vec_len(h_.get()); }

private:
    detail::Handle<tp_far_vec, tp_far_vec_free> h_;
};

/// A block of bytes in far memory, read and written in part.
class FarBlock {
public:
    FarBlock(const Far &far, const Section &section, size_t size)
        : h_(detail::made(tp_far_block_new(far.get(), section.get(), size), "tp_far_block_new")) {}

    void read(size_t offset, void *out, size_t len) const {
        detail::check(tp_far_block_read(h_.get(), offset, out, len), "FarBlock::read");
    }
    void write(size_t offset, const void *src, size_t len) {
        detail::check(tp_far_block_write(h_.get(), offset, src, len), "FarBlock::write");
    }
    void flush() { detail::check(tp_far_block_flush(h_.get()), "FarBlock::flush"); }
    size_t size() const noexcept { return tp_far_block_size(h_.get()); }

private:
    detail::Handle<tp_far_block, tp_far_block_free> h_;
};

/// A userfaultfd pager: at most `local_budget` bytes of its regions are mapped, the rest
/// lives in the far store.
class Pager {
public:
    explicit Pager(size_t local_budget, const std::string &url = "local:")
        : h_(detail::made(tp_pager_start(url.c_str(), local_budget), "tp_pager_start")) {}

    void set_budget(size_t bytes) {
        detail::check(tp_pager_set_budget(h_.get(), bytes), "tp_pager_set_budget");
    }

    tp_pager_stats stats() const {
        tp_pager_stats s{};
        detail::check(tp_pager_stats_get(h_.get(), &s), "tp_pager_stats_get");
        return s;
    }

    const tp_pager *get() const noexcept { return h_.get(); }

private:
    detail::Handle<tp_pager, tp_pager_free> h_;
};

/// Ordinary memory served by a pager: use `data()` as any buffer, from any thread.
class Region {
public:
    Region(const Pager &pager, size_t len)
        : h_(detail::made(tp_region_new(pager.get(), len), "tp_region_new")) {}

    void *data() const noexcept { return tp_region_ptr(h_.get()); }
    size_t size() const noexcept { return tp_region_len(h_.get()); }

    /// Forgets the whole pages within [offset, offset + len): they read as zeros after.
    void discard(size_t offset, size_t len) {
        detail::check(tp_region_discard(h_.get(), offset, len), "Region::discard");
    }

private:
    detail::Handle<tp_region, tp_region_free> h_;
};

} // namespace tidepool

#endif // TIDEPOOL_HPP
