// The kernel harness of worker/tests/cuda_host.rs (after math.h, threaded.h, the prelude and the
// kernels): `harness KERNEL ARGS OUT`.
#include <string>
int main(int argc, char** argv) {
    if (argc != 4) return 1;
    const std::string k = argv[1];
    std::vector<std::vector<uint32_t>> a;
    FILE* in = std::fopen(argv[2], "rb");
    uint32_t len;
    while (in && std::fread(&len, 4, 1, in) == 1) {
        a.emplace_back(len);
        if (std::fread(a.back().data(), 4, len, in) != len) return 1;
    }
    auto I = [&](size_t i, size_t j) { return (int)a.at(i).at(j); };
    auto F = [&](size_t i, size_t j) { return __uint_as_float(a.at(i).at(j)); };
    auto P = [&](size_t i) { return reinterpret_cast<float*>(a.at(i).data()); };
    std::vector<float> out;
    if (k == "rope") {  // ints n, width, nh, nkv, hd, neox | base, pos_scale | positions | factors | qkv
        const int n = I(0, 0);
        host_launch(n, 1, 128, [&] {
            rope(P(4), reinterpret_cast<const int*>(a[2].data()), n, I(0, 1), I(0, 2), I(0, 3), I(0, 4),
                 F(1, 0), F(1, 1), P(3), I(0, 5));
        });
        out.assign(P(4), P(4) + a[4].size());
    } else if (k == "bias_add") {  // ints n, width | bias | x
        host_launch(3, 1, 64, [&] { bias_add(P(2), P(1), I(0, 0), I(0, 1)); });
        out.assign(P(2), P(2) + a[2].size());
    } else if (k == "swiglu" || k == "geglu") {  // ints n, ffn | gate_up
        out.resize((size_t)I(0, 0) * I(0, 1));
        host_launch(3, 1, 64, [&] {
            if (k == "geglu") geglu(P(1), I(0, 0), I(0, 1), out.data());
            else swiglu(P(1), I(0, 0), I(0, 1), out.data());
        });
    } else if (k == "head_rmsnorm") {  // ints n, width, nh, nkv, hd | eps | q_norm | k_norm | qkv
        host_launch(I(0, 0), 1, HEAD_NORM_THREADS, [&] {
            head_rmsnorm(P(4), P(2), P(3), I(0, 0), I(0, 1), I(0, 2), I(0, 3), I(0, 4), F(1, 0));
        });
        out.assign(P(4), P(4) + a[4].size());
    } else if (k == "softcap") {  // cap | x
        host_launch(3, 1, 64, [&] { softcap(P(1), (int)a[1].size(), F(0, 0)); });
        out.assign(P(1), P(1) + a[1].size());
    } else if (k == "embedding") {  // ints n, fmt, hidden | scale | tokens | table bytes
        const int n = I(0, 0), hidden = I(0, 2);
        out.resize((size_t)n * hidden);
        host_launch(n, 1, 128, [&] {
            embedding(a[2].data(), n, reinterpret_cast<const u8*>(a[3].data()), I(0, 1), hidden, F(1, 0),
                      out.data());
        });
    } else if (k == "attention_decode") {
        // ints width, n_rows, max_blocks, block_size, nh, nkv, hd, window | scale, softcap |
        // positions | table_index | block_tables | k_cache | v_cache | qkv
        const int n = I(0, 1), nh = I(0, 4), hd = I(0, 6);
        out.resize((size_t)n * nh * hd);
        host_launch(n, nh, 128, [&] {
            attention_decode(P(7), I(0, 0), reinterpret_cast<const int*>(a[2].data()),
                             reinterpret_cast<const int*>(a[3].data()), a[4].data(), I(0, 2), P(5), P(6),
                             I(0, 3), nh, I(0, 5), hd, F(1, 0), out.data(), n, F(1, 1), I(0, 7));
        });
    } else {
        return 1;
    }
    FILE* o = std::fopen(argv[3], "wb");
    return o && std::fwrite(out.data(), 4, out.size(), o) == out.size() && std::fclose(o) == 0 ? 0 : 1;
}
