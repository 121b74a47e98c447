// Far memory from C++: a FarVector and a FarBlock larger than their cache section, a soft
// pool of objects rebuilt from their read arguments (Midas's Listing 1), a SoftMap of
// strings, and a pager Region used as plain memory. Exits 0 when every check holds.
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <tidepool.hpp>

static int failures = 0;

static void expect(bool ok, const std::string &what) {
    if (!ok) {
        std::fprintf(stderr, "far_memory: FAILED: %s\n", what.c_str());
        failures++;
    }
}

struct Point {
    double x, y, z;
};

int main() try {
    // 1M points (24 MiB) in far memory, cached in 256 KiB of 4 KiB lines.
    tidepool::Far far("local:");
    tidepool::Section section(tidepool::Structure::SetAssociative, 4096, 256 << 10, 8);
    const size_t n = 1 << 20;
    tidepool::FarVector<Point> points(far, section, n);
    std::vector<Point> chunk(4096);
    for (size_t first = 0; first < n; first += chunk.size()) {
        for (size_t j = 0; j < chunk.size(); j++) {
            double i = static_cast<double>(first + j);
            chunk[j] = Point{i, 2 * i, 3 * i};
        }
        points.write(first, chunk.size(), chunk.data());
    }
    double sum = 0;
    for (size_t first = 0; first < n; first += chunk.size()) {
        points.read(first, chunk.size(), chunk.data());
        for (const Point &p : chunk) {
            sum += p.z - p.y - p.x;
        }
    }
    expect(sum == 0 && points[123457].y == 246914, "points read back");
    points.set(7, Point{1, 1, 1});
    expect(points.get(7).z == 1, "set and get");
    auto st = section.stats();
    expect(st.fetched > 0 && st.writebacks > 0, "the vector went far and came back");

    tidepool::FarBlock block(far, section, 1 << 20);
    const char msg[] = "hello from the middle of a far block";
    block.write(500000, msg, sizeof msg);
    char back[sizeof msg] = {};
    block.read(500000, back, sizeof back);
    expect(std::string(back) == msg, "far block bytes");

    // Listing 1: objects rebuilt from the arguments of the read that finds them gone.
    tidepool::Arena arena(16 << 20, false);
    tidepool::SoftMemPool<uint64_t, uint64_t, uint64_t> pool(
        [](uint64_t a, uint64_t b) { return a * b; }, arena);
    auto product = pool.new_unique();
    expect(product.read(6, 7) == 42, "built from the read's arguments");
    product.write(5);
    expect(product.read(6, 7) == 5, "a written value is kept");
    expect(product.cmpxchg(5, 9) && product.read(0, 0) == 9, "cmpxchg");
    arena.set_budget(0);
    arena.set_budget(16 << 20);
    expect(product.read(3, 4) == 12, "rebuilt after the memory was taken back");

    tidepool::SoftMap<std::string, std::string> names(
        [](const std::string &k) { return "name of " + k; }, arena);
    names.put("a", "alice");
    expect(names.get("a") == std::string("alice"), "map value");
    expect(names.get(std::string(1000, 'k'))->size() == 1008, "a reconstructed long value");
    expect(names.remove("a") && !names.remove("a"), "remove");
    tidepool::SoftMap<uint32_t, std::vector<double>> plain(arena);
    plain.put(1, std::vector<double>(300, 0.5));
    expect(plain.get(1)->size() == 300 && !plain.get(2), "vector values, missing keys");

    // A pager region: 64 MiB of ordinary memory, 8 MiB of it local at a time.
    tidepool::Pager pager(8 << 20);
    tidepool::Region region(pager, 64 << 20);
    auto *words = static_cast<uint64_t *>(region.data());
    size_t count = region.size() / sizeof(uint64_t);
    for (size_t i = 0; i < count; i++) {
        words[i] = i;
    }
    uint64_t total = std::accumulate(words, words + count, uint64_t{0});
    expect(total == count * (count - 1) / 2, "the region's sum");
    auto ps = pager.stats();
    expect(ps.evicted > 0 && ps.far_fetches > 0, "region pages went far and came back");

    std::printf("far_memory: section %llu fetched, %llu written back; pager %llu evicted, "
                "%llu fetched\n",
                (unsigned long long)st.fetched, (unsigned long long)st.writebacks,
                (unsigned long long)ps.evicted, (unsigned long long)ps.far_fetches);
    if (failures != 0) {
        return 1;
    }
    std::printf("far_memory: ok\n");
    return 0;
} catch (const std::exception &e) {
    std::fprintf(stderr, "far_memory: %s\n", e.what());
    return 1;
}
