// trainer/hf_cache.c — --model ORG/NAME read from the local Hugging Face cache, the way
// huggingface_hub lays it out (hub/models--ORG--NAME/{refs/main, snapshots/<commit>/}). Nothing
// is downloaded: a model that is not there is an error naming the folder looked in.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "trainer/options.h"

// ORG/NAME: two non-empty parts of letters, digits, '-', '_', '.', not "." or "..".
static int is_repo_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/')) return 0;
    if (s[0] == '.' || slash[1] == '.') return 0;
    for (const char *p = s; *p; p++)
        if (!(*p == '/' || *p == '-' || *p == '_' || *p == '.' || (*p >= '0' && *p <= '9') ||
              (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
            return 0;
    return 1;
}

// huggingface_hub's order: HF_HUB_CACHE, then HF_HOME/hub, then XDG_CACHE_HOME/huggingface/hub,
// then ~/.cache/huggingface/hub.
static void hub_dir(char *buf, size_t n) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) snprintf(buf, n, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v) snprintf(buf, n, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) snprintf(buf, n, "%s/huggingface/hub", v);
    else snprintf(buf, n, "%s/.cache/huggingface/hub", getenv("HOME") ? getenv("HOME") : "");
}

int mt_hf_cache_resolve(const char *name, char *dir, size_t n) {
    struct stat st;
    if (stat(name, &st) == 0 || !is_repo_id(name)) return 1;  // a path here, or not a repo id
    char hub[2048], repo[3072], path[3300];
    hub_dir(hub, sizeof hub);
    const char *slash = strchr(name, '/');
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", hub, (int)(slash - name), name, slash + 1);
    if (!mt_is_dir(repo)) {
        mt_error_set("%s is neither a folder here nor in the Hugging Face cache (looked in %s; set HF_HOME or "
                     "HF_HUB_CACHE if the cache is elsewhere; moetrain downloads nothing: "
                     "`huggingface-cli download %s` fetches it)", name, repo, name);
        return -1;
    }
    // refs/main names the snapshot; without it (a cache filled by revision), a single snapshot.
    char *ref = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/refs/main", repo);
    if (mt_read_file(path, 256, &ref, &len) == 0) {
        while (len && (ref[len - 1] == '\n' || ref[len - 1] == ' ' || ref[len - 1] == '\r')) ref[--len] = 0;
        snprintf(path, sizeof path, "%s/snapshots/%s", repo, ref);
        free(ref);
    } else {
        snprintf(path, sizeof path, "%s/snapshots", repo);
        DIR *d = opendir(path);
        int found = 0;
        char only[512] = "";
        for (struct dirent *e; d && (e = readdir(d));)
            if (e->d_name[0] != '.') found++, snprintf(only, sizeof only, "%s", e->d_name);
        if (d) closedir(d);
        if (found != 1) {
            mt_error_set("%s: %s has no refs/main and %d snapshots: pass the snapshot folder itself", name, repo, found);
            return -1;
        }
        snprintf(path, sizeof path, "%s/snapshots/%s", repo, only);
    }
    if (!mt_is_dir(path)) {
        mt_error_set("%s: the Hugging Face cache's snapshot %s is missing", name, path);
        return -1;
    }
    if (strlen(path) >= n) {
        mt_error_set("%s: path too long", path);
        return -1;
    }
    strcpy(dir, path);
    return 0;
}
