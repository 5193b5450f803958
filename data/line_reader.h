// data/line_reader.h — JSONL lines read in bounded pieces: memory per line set by what a sample
// can use, not by the line's length.
//
// A line is read through a fixed buffer. Everything outside JSON strings is kept; a string is
// kept up to `string_cap` decoded bytes (cut at a character boundary, never inside an escape or
// a UTF-8 sequence, then closed as usual), and the rest of it is only scanned: raw control bytes,
// bad escapes and bad UTF-8 there are errors as anywhere else (the parser would refuse them), and
// the line is marked `cut`. The data layer sets string_cap so that the kept text already holds
// more tokens than --seq: a cut sample is overlong either way (data.c). A line keeping more than
// `max_keep` bytes (a million keys, a 100 MB array of numbers, very many long strings) is
// refused naming the line: --max-line-bytes.
//
// Ends of file and errors are told apart: a read error (ferror) is an error naming the line it
// was in; an allocation that fails exits MT_EXIT_OOM naming the line (core/common.h).
#pragma once
#include <stdint.h>
#include <stdio.h>

typedef struct mt_line_reader {
    FILE *f;
    const char *path;
    size_t string_cap;     // decoded bytes kept of each JSON string
    size_t max_keep;       // kept bytes of a line beyond which it is refused
    char *line;            // the kept bytes of the current line (NUL-terminated) and their count
    size_t len, cap;
    int64_t lineno;        // of the current line, from 1
    uint64_t raw_len;      // the line's length in the file
    int cut;               // 1: a string of this line was cut at string_cap
    unsigned char io[1 << 16];
    size_t io_n, io_at;
    int eof;
} mt_line_reader;

void mt_line_reader_init(mt_line_reader *r, FILE *f, const char *path, size_t string_cap,
                         size_t max_keep);
// 1: the next line is in r->line (without its '\n'); 0: end of file; -1: an error naming the
// file and the line.
int mt_line_next(mt_line_reader *r);
void mt_line_reader_free(mt_line_reader *r);
