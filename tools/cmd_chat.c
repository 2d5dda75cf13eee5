/*
 * cmd_chat.c — `tern chat [MODEL] [--system S] [sampling flags]`: an interactive conversation.
 * Each line read from stdin is a user turn; the whole conversation is re-rendered with the
 * model's chat template every turn (the prefix cache makes the repeated prefix cheap) and the
 * reply streams to stdout. Commands: /reset clears the conversation, /exit (or EOF) ends.
 */
#include "cli.h"
#include "cli_text.h"
#include "cli_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tern_cmd_chat(int argc, char **argv) {
    cli_text_flags f = {.temperature = -1, .top_p = -1, .min_p = -1, .seed = -1, .compute_bf16 = -1};
    const char *system = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_text_flag(&f, "chat", argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--system") && i + 1 < argc) system = argv[++i];
        else if (argv[i][0] != '-' && !f.model) f.model = argv[i];
        else return cli_usage_error("chat", "unknown or incomplete argument '%s'", argv[i]);
    }
    cli_text t;
    int rc = cli_text_open(&t, &f, "chat");
    if (rc) return rc;
    if (!t.tpl) { cli_text_close(&t); return cli_usage_error("chat", "the model has no chat template"); }
    int tty = isatty(0);
    cJSON *msgs = cJSON_CreateArray();
    if (system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system);
        cJSON_AddItemToArray(msgs, m);
    }
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty) { fputs("> ", stdout); fflush(stdout); }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            while (cJSON_GetArraySize(msgs) > (system ? 1 : 0)) cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
            continue;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", line);
        cJSON_AddItemToArray(msgs, m);
        int32_t *ids = NULL;
        int nid = 0;
        char *reply = NULL;
        rc = cli_text_chat_ids(&t, msgs, &ids, &nid, "chat");
        if (!rc) rc = cli_text_run(&t, ids, nid, &reply, "chat");
        free(ids);
        printf("\n");
        if (rc) { free(reply); break; }
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", reply ? reply : "");
        cJSON_AddItemToArray(msgs, a);
        free(reply);
    }
    free(line);
    cJSON_Delete(msgs);
    cli_text_close(&t);
    return rc;
}
