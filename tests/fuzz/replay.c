/* SPDX-License-Identifier: MIT */
/*
 * replay.c - a main() for the fuzz targets where libFuzzer is not linked in (gcc builds,
 * the normal test run): feed every file named, or every file in every directory named,
 * to LLVMFuzzerTestOneInput once. A target that finds a bug aborts, failing the test.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
        FILE *f = fopen(path, "rb");
        if (!f) {
                perror(path);
                return -1;
        }
        uint8_t *buf = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
                if (n == cap) {
                        cap = cap ? cap * 2 : 4096;
                        uint8_t *p = realloc(buf, cap);
                        if (!p) {
                                free(buf);
                                fclose(f);
                                return -1;
                        }
                        buf = p;
                }
                size_t k = fread(buf + n, 1, cap - n, f);
                if (k == 0)
                        break;
                n += k;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        free(buf);
        return 0;
}

int main(int argc, char **argv) {
        int files = 0;
        for (int i = 1; i < argc; i++) {
                struct stat st;
                if (stat(argv[i], &st) < 0) {
                        perror(argv[i]);
                        return 1;
                }
                if (!S_ISDIR(st.st_mode)) {
                        if (run_file(argv[i]) < 0)
                                return 1;
                        files++;
                        continue;
                }
                DIR *d = opendir(argv[i]);
                struct dirent *e;
                while (d && (e = readdir(d))) {
                        char path[4096];
                        if (e->d_name[0] == '.')
                                continue;
                        snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
                        if (run_file(path) < 0)
                                return 1;
                        files++;
                }
                if (d)
                        closedir(d);
        }
        printf("%d inputs replayed, no crash\n", files);
        return files ? 0 : 1;
}
