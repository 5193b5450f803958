// core/crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord files frame
// their records with it (trainer/tensorboard.c).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// CRC-32C of data[0..n) continuing from `crc` (0 to start): mt_crc32c(0, "123456789", 9) is
// 0xE3069283, the check value of the CRC catalogue.
uint32_t mt_crc32c(uint32_t crc, const void *data, size_t n);
// TFRecord's masked form, ((crc >> 15) | (crc << 17)) + 0xa282ead8: a CRC over bytes that hold
// CRCs of their own would otherwise be weak.
uint32_t mt_crc32c_masked(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
