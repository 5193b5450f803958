// core/crc32c.c — CRC-32C, byte at a time from a 256-entry table (event files are small; no need
// for the SSE4.2 instruction).
#include "core/crc32c.h"

static uint32_t table[256];
static int table_ready;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
    table_ready = 1;
}

uint32_t mt_crc32c(uint32_t crc, const void *data, size_t n) {
    if (!table_ready) make_table();  // idempotent: a race writes the same values
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t mt_crc32c_masked(const void *data, size_t n) {
    uint32_t crc = mt_crc32c(0, data, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
