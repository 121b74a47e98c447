// Midas's BlockCache (Listing 2): a user-level cache of storage blocks, like the kernel's page
// cache, in a soft array. Reads come from the array; a block whose memory was taken back is
// read from storage again by the array's reconstructor. Writes go to both.
//
// The "storage" is a temporary file. The example checks the cache against it through reads,
// writes, and a moment when all soft memory is taken back, and exits 0 when all is right.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include <tidepool.hpp>

struct Block {
    uint8_t data[4096];
};

/// A file of blocks, counting the reads that reach it.
class Storage {
public:
    explicit Storage(size_t blocks) : file_(std::tmpfile()) {
        if (file_ == nullptr) {
            throw std::runtime_error("cannot create a temporary file");
        }
        for (size_t i = 0; i < blocks; i++) {
            write(i, pattern(i, 0));
        }
    }
    ~Storage() { std::fclose(file_); }

    Block read(size_t idx) {
        Block b;
        if (pread(fileno(file_), &b, sizeof b, static_cast<off_t>(idx * sizeof b)) != sizeof b) {
            throw std::runtime_error("short read of block " + std::to_string(idx));
        }
        reads++;
        return b;
    }

    void write(size_t idx, const Block &b) {
        if (pwrite(fileno(file_), &b, sizeof b, static_cast<off_t>(idx * sizeof b)) != sizeof b) {
            throw std::runtime_error("short write of block " + std::to_string(idx));
        }
    }

    /// Block `idx`'s contents in version `v`.
    static Block pattern(size_t idx, unsigned v) {
        Block b;
        for (size_t j = 0; j < sizeof b.data; j++) {
            b.data[j] = static_cast<uint8_t>(idx * 31 + j * 7 + v * 101);
        }
        return b;
    }

    size_t reads = 0;

private:
    std::FILE *file_;
};

class BlockCache {
public:
    BlockCache(size_t sz, Storage &storage, tidepool::Arena &arena)
        : storage_(storage),
          array_(sz, [this](size_t idx) { return storage_.read(idx); }, arena) {}

    Block read(size_t idx) { return array_.read(idx); }

    void write(size_t idx, const Block &block) {
        array_.write(idx, block);
        storage_.write(idx, block);
    }

    tidepool::Stats stats() const { return array_.stats(); }

private:
    Storage &storage_;
    tidepool::SoftArray<Block> array_;
};

static int failures = 0;

static void expect(bool ok, const std::string &what) {
    if (!ok) {
        std::fprintf(stderr, "block_cache: FAILED: %s\n", what.c_str());
        failures++;
    }
}

int main() try {
    const size_t blocks = 1024; // 4 MiB
    tidepool::Arena arena(64 << 20, false);
    Storage storage(blocks);
    BlockCache cache(blocks, storage, arena);

    // A first read of each block goes to storage; the second is served from soft memory.
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < blocks; i++) {
            Block b = cache.read(i), want = Storage::pattern(i, 0);
            expect(std::memcmp(&b, &want, sizeof b) == 0,
                   "block " + std::to_string(i) + " on pass " + std::to_string(pass));
        }
    }
    expect(storage.reads == blocks, "one storage read per block, got " +
                                        std::to_string(storage.reads));

    // Writes update the cache and the storage.
    for (size_t i = 0; i < blocks; i += 3) {
        cache.write(i, Storage::pattern(i, 1));
    }

    // Memory pressure: every block's memory is taken back. Reads still see the newest data,
    // read back from storage.
    arena.set_budget(0);
    arena.set_budget(64 << 20);
    size_t before = storage.reads;
    for (size_t i = 0; i < blocks; i++) {
        Block b = cache.read(i), want = Storage::pattern(i, i % 3 == 0 ? 1 : 0);
        expect(std::memcmp(&b, &want, sizeof b) == 0,
               "block " + std::to_string(i) + " after the memory was taken back");
    }
    expect(storage.reads - before == blocks, "every block read back from storage");

    // A reconstructor's exception reaches the reader.
    tidepool::SoftArray<Block> broken(
        4, [](size_t) -> Block { throw std::runtime_error("disk on fire"); }, arena);
    bool thrown = false;
    try {
        broken.read(2);
    } catch (const std::runtime_error &e) {
        thrown = std::string(e.what()) == "disk on fire";
    }
    expect(thrown, "the reconstructor's exception is rethrown");

    // cmpxchg: only the expected value is replaced.
    expect(!cache.stats().reconstruct_failures, "no failed reconstruction");
    tidepool::SoftArray<uint64_t> counters(8, [](size_t i) { return uint64_t{i}; }, arena);
    expect(counters.cmpxchg(5, 5, 50), "cmpxchg from the current value");
    expect(!counters.cmpxchg(5, 5, 60), "cmpxchg from a stale value");
    expect(counters.read(5) == 50, "cmpxchg's result");

    tidepool::Stats s = cache.stats();
    std::printf("block_cache: %zu blocks, %llu hits, %llu misses, %llu reconstructions "
                "(%.1f us each), %zu storage reads\n",
                blocks, (unsigned long long)s.hits, (unsigned long long)s.misses,
                (unsigned long long)s.reconstructions, s.reconstruct_us, storage.reads);
    expect(s.hits >= blocks, "hits on the second pass");
    if (failures != 0) {
        return 1;
    }
    std::printf("block_cache: ok\n");
    return 0;
} catch (const std::exception &e) {
    std::fprintf(stderr, "block_cache: %s\n", e.what());
    return 1;
}
