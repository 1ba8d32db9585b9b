// The decoder harness of worker/tests/cuda_host.rs (after math.h, threaded.h and the prelude).
int main(int argc, char** argv) {
    if (argc != 3) return 1;
    FILE* in = std::fopen(argv[1], "rb");
    FILE* out = std::fopen(argv[2], "wb");
    if (!in || !out) return 1;
    uint32_t hdr[4];
    while (std::fread(hdr, 4, 4, in) == 4) {
        const int fmt = (int)hdr[0], rows = (int)hdr[1], cols = (int)hdr[2];
        std::vector<unsigned char> b(hdr[3]);
        if (std::fread(b.data(), 1, b.size(), in) != b.size()) return 1;
        const i64 rb = row_bytes_of(fmt, cols);
        if (rb * rows != (i64)b.size()) {
            std::fprintf(stderr, "row_bytes_of(%d, %d) = %lld: %d rows are not %u bytes\n", fmt, cols,
                         (long long)rb, rows, hdr[3]);
            return 2;
        }
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols / CHUNK; c++) {
                float w[CHUNK];
                dequant_chunk_any(fmt, b.data() + r * rb, c, w);
                std::fwrite(w, 4, CHUNK, out);
            }
    }
    return std::fclose(out) == 0 ? 0 : 1;
}
