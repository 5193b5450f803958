// trainer/train_template.c — training_template.json: how an adapter's training rows were
// rendered, so that `generate` renders its prompt the same way (trainer/cmd/commands.h).
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "trainer/cmd/commands.h"

int mt_train_template_write(const char *dir, const mt_train_template *t) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, MT_TRAIN_TEMPLATE_FILE);
    cJSON *j = cJSON_CreateObject(), *rows = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", "moetrain-training-template");
    cJSON_AddStringToObject(j, "chat_template", t->chat_template);
    cJSON_AddNumberToObject(rows, "text", (double)t->text);
    cJSON_AddNumberToObject(rows, "instruction", (double)t->instruction);
    cJSON_AddNumberToObject(rows, "chat", (double)t->chat);
    cJSON_AddNumberToObject(rows, "pretokenized", (double)t->pretokenized);
    cJSON_AddItemToObject(j, "rows", rows);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    int rc = mt_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

int mt_train_template_read(const char *adapter, mt_train_template *t) {
    memset(t, 0, sizeof *t);
    char path[4200];
    struct stat st;
    if (stat(adapter, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(path, sizeof path, "%s/%s", adapter, MT_TRAIN_TEMPLATE_FILE);
    } else {
        const char *slash = strrchr(adapter, '/');
        if (slash) snprintf(path, sizeof path, "%.*s/%s", (int)(slash - adapter), adapter, MT_TRAIN_TEMPLATE_FILE);
        else snprintf(path, sizeof path, "%s", MT_TRAIN_TEMPLATE_FILE);
    }
    if (stat(path, &st) != 0) return 0;
    char *text;
    size_t len;
    if (mt_read_file(path, 1 << 16, &text, &len) != 0) return -1;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *name = cJSON_GetObjectItem(j, "chat_template"), *rows = cJSON_GetObjectItem(j, "rows");
    if (!cJSON_IsString(name) || !cJSON_IsObject(rows) || strlen(name->valuestring) >= sizeof t->chat_template) {
        cJSON_Delete(j);
        mt_error_set("%s: not a training template record (chat_template, rows)", path);
        return -1;
    }
    strcpy(t->chat_template, name->valuestring);
    const struct { const char *key; int64_t *v; } f[] = {
        {"text", &t->text}, {"instruction", &t->instruction}, {"chat", &t->chat}, {"pretokenized", &t->pretokenized}};
    for (size_t i = 0; i < MT_ARRAY_LEN(f); i++) {
        const cJSON *v = cJSON_GetObjectItem(rows, f[i].key);
        *f[i].v = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 9e15 ? (int64_t)v->valuedouble : 0;
    }
    cJSON_Delete(j);
    return 0;
}
