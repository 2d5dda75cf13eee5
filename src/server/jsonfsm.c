/*
 * jsonfsm.c — the JSON grammar, its byte-level pushdown automaton and the token mask
 * (see jsonfsm.h for the contract).
 *
 * Grammar: an array of nodes (node 0 = any value). A node has a set of allowed types, an
 * optional enum (literal texts, compact JSON), object properties (keys as literals "\"k\"",
 * a required bitmask, additionalProperties: a node or -1) and an items node. All literals
 * (true, false, null, enum texts, quoted keys) live in one table; a literal being matched is
 * a 64-bit candidate set over a run of that table plus a byte position.
 *
 * Automaton state: a lexer mode (between tokens / string / escape / \u / number / literal)
 * plus a stack of open containers (object phase, seen-keys bitmask, current property). A
 * number or a literal ends at the first byte that cannot continue it; that byte is then
 * processed again by the enclosing container (so "12}" works). The state is a flat struct
 * whose live part is the header plus `depth` frames, which is what the trie walk copies.
 */
#include "server/jsonfsm.h"

#include "base/base.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64, T_ANY = 127 };
#define MAXD 32
#define WS_MAX 8
#define NUM_MAX 24
#define N_CACHE 8

typedef struct jnode {
    int types;
    int enum_lo, n_enum;         /* literal table run */
    int key_lo, n_props;         /* literal table run of "\"key\"" texts */
    int *prop_node;              /* [n_props] */
    uint64_t required;
    int addl;                    /* node for other keys, -1 = none allowed */
    int items;
} jnode;

struct srv_jgram {
    jnode *nodes;
    int n_nodes, cap_nodes, root;
    char **lit;
    size_t *lit_len;
    int n_lit, cap_lit;
};

enum { L_NONE, L_STR, L_ESC, L_U, L_NUM, L_LIT };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXPS, N_EXPD };
enum { OP_KEY_OR_END, OP_KEY, OP_COLON, OP_VALUE, OP_NEXT, AP_VALUE_OR_END, AP_VALUE, AP_NEXT };

typedef struct jframe {
    uint64_t seen;
    int16_t node, prop;          /* prop: property of the current key, -1 = additional */
    uint8_t phase, pad[3];
} jframe;

typedef struct jstate {
    uint64_t cand;               /* literal / key candidates (bit i = lit_lo + i) */
    int16_t lit_lo, pos;
    uint8_t lex, sub, u8need, u8lo, u8hi, ws, numlen, is_key, is_int, key_free, done, depth;
    jframe f[MAXD];
} jstate;

#define LIVE(s) (offsetof(jstate, f) + sizeof(jframe) * (size_t)(s)->depth)

/* ---- grammar ------------------------------------------------------------------------ */

static int add_lit(srv_jgram *g, const char *t, size_t n) {
    if (g->n_lit == g->cap_lit) {
        int nc = g->cap_lit ? g->cap_lit * 2 : 16;
        char **l = realloc(g->lit, sizeof(char *) * (size_t)nc);
        if (!l) return -1;
        g->lit = l;
        size_t *ll = realloc(g->lit_len, sizeof(size_t) * (size_t)nc);
        if (!ll) return -1;
        g->lit_len = ll;
        g->cap_lit = nc;
    }
    char *c = malloc(n + 1);
    if (!c) return -1;
    memcpy(c, t, n);
    c[n] = 0;
    g->lit[g->n_lit] = c;
    g->lit_len[g->n_lit] = n;
    return g->n_lit++;
}

static int add_node(srv_jgram *g, int types) {
    if (g->n_nodes == g->cap_nodes) {
        int nc = g->cap_nodes ? g->cap_nodes * 2 : 8;
        if (nc > 30000) return -1;
        jnode *v = realloc(g->nodes, sizeof(jnode) * (size_t)nc);
        if (!v) return -1;
        g->nodes = v;
        g->cap_nodes = nc;
    }
    jnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->types = types;
    n->items = 0;
    n->addl = 0;
    return g->n_nodes++;
}

void srv_jgram_free(srv_jgram *g) {
    if (!g) return;
    for (int i = 0; i < g->n_nodes; i++) free(g->nodes[i].prop_node);
    for (int i = 0; i < g->n_lit; i++) free(g->lit[i]);
    free(g->nodes);
    free(g->lit);
    free(g->lit_len);
    free(g);
}

static int type_bit(const char *t) {
    static const struct { const char *n; int b; } k[] = {{"object", T_OBJ}, {"array", T_ARR}, {"string", T_STR},
        {"number", T_NUM | T_INT}, {"integer", T_INT}, {"boolean", T_BOOL}, {"null", T_NULL}};
    for (size_t i = 0; i < TERN_ARRAY_LEN(k); i++)
        if (!strcmp(t, k[i].n)) return k[i].b;
    return 0;
}

static int compile(srv_jgram *g, const cJSON *s, int depth, const char *path, tern_error *err);

static int compile_props(srv_jgram *g, int id, const cJSON *s, int depth, const char *path, tern_error *err) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char sub[200];
    if (props && !cJSON_IsObject(props))
        return tern_err(err, TERN_EINVAL, "%s.properties: expected an object", path), -1;
    int np = props ? cJSON_GetArraySize(props) : 0;
    if (np > 64) return tern_err(err, TERN_EINVAL, "%s.properties: at most 64 properties are supported", path), -1;
    int *pn = np ? calloc((size_t)np, sizeof(int)) : NULL;
    if (np && !pn) return tern_err(err, TERN_ENOMEM, "out of memory"), -1;
    int lo = g->n_lit, i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        cJSON *ks = cJSON_CreateString(p->string);
        char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!kt || add_lit(g, kt, strlen(kt)) < 0) { free(kt); free(pn); return tern_err(err, TERN_ENOMEM, "out of memory"), -1; }
        free(kt);
    }
    cJSON_ArrayForEach(p, props) {             /* after all keys: the key literals stay contiguous */
        snprintf(sub, sizeof sub, "%.120s.properties.%.40s", path, p->string);
        int c = compile(g, p, depth + 1, sub, err);
        if (c < 0) { free(pn); return -1; }
        pn[i++] = c;
    }
    jnode *n = &g->nodes[id];
    n->key_lo = lo;
    n->n_props = np;
    n->prop_node = pn;
    if (req && !cJSON_IsArray(req)) return tern_err(err, TERN_EINVAL, "%s.required: expected a list of names", path), -1;
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        int k = -1, j = 0;
        const cJSON *q;
        if (!cJSON_IsString(r)) return tern_err(err, TERN_EINVAL, "%s.required: expected strings", path), -1;
        cJSON_ArrayForEach(q, props) { if (!strcmp(q->string, r->valuestring)) k = j; j++; }
        if (k < 0)
            return tern_err(err, TERN_EINVAL, "%s.required: \"%.60s\" is not in properties (unsupported)", path,
                            r->valuestring), -1;
        g->nodes[id].required |= 1ull << k;
    }
    if (cJSON_IsFalse(ap)) g->nodes[id].addl = -1;
    else if (cJSON_IsObject(ap)) {
        snprintf(sub, sizeof sub, "%.150s.additionalProperties", path);
        int c = compile(g, ap, depth + 1, sub, err);
        if (c < 0) return -1;
        g->nodes[id].addl = c;
    } else if (ap && !cJSON_IsTrue(ap))
        return tern_err(err, TERN_EINVAL, "%s.additionalProperties: expected a boolean or a schema", path), -1;
    return 0;
}

static int compile(srv_jgram *g, const cJSON *s, int depth, const char *path, tern_error *err) {
    if (depth > 24) return tern_err(err, TERN_EINVAL, "%s: schema nested too deeply", path), -1;
    if (cJSON_IsTrue(s)) return 0;
    if (!cJSON_IsObject(s)) return tern_err(err, TERN_EINVAL, "%s: expected a schema object", path), -1;
    static const char *k_bad[] = {"$ref", "anyOf", "oneOf", "allOf", "not", "if", "pattern", "patternProperties",
                                  "prefixItems", "$defs", "definitions"};
    for (size_t i = 0; i < TERN_ARRAY_LEN(k_bad); i++)
        if (cJSON_GetObjectItemCaseSensitive(s, k_bad[i]))
            return tern_err(err, TERN_EINVAL, "%s: schema keyword \"%s\" is not supported", path, k_bad[i]), -1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    int types = 0;
    if (cJSON_IsString(t)) {
        if (!(types = type_bit(t->valuestring)))
            return tern_err(err, TERN_EINVAL, "%s.type: unknown type \"%.40s\"", path, t->valuestring), -1;
    } else if (cJSON_IsArray(t)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, t) {
            int b = cJSON_IsString(x) ? type_bit(x->valuestring) : 0;
            if (!b) return tern_err(err, TERN_EINVAL, "%s.type: expected type names", path), -1;
            types |= b;
        }
    } else if (t) return tern_err(err, TERN_EINVAL, "%s.type: expected a string or a list", path), -1;
    else if (cJSON_GetObjectItemCaseSensitive(s, "properties")) types = T_OBJ;
    else if (cJSON_GetObjectItemCaseSensitive(s, "items")) types = T_ARR;
    else types = T_ANY;
    if (!types) return tern_err(err, TERN_EINVAL, "%s.type: empty", path), -1;
    int id = add_node(g, types);
    if (id < 0) return tern_err(err, TERN_ENOMEM, "%s: schema too large", path), -1;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0 || cJSON_GetArraySize(en) > 64))
            return tern_err(err, TERN_EINVAL, "%s.enum: expected a list of 1..64 values", path), -1;
        int lo = g->n_lit;
        const cJSON *x = en ? en->child : cn;
        for (; x; x = en ? x->next : NULL) {
            char *txt = cJSON_PrintUnformatted(x);
            if (!txt || add_lit(g, txt, strlen(txt)) < 0) { free(txt); return tern_err(err, TERN_ENOMEM, "out of memory"), -1; }
            free(txt);
        }
        g->nodes[id].enum_lo = lo;
        g->nodes[id].n_enum = g->n_lit - lo;
        return id;
    }
    if (types & T_OBJ && compile_props(g, id, s, depth, path, err)) return -1;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
    if (it && (types & T_ARR)) {
        char sub[200];
        snprintf(sub, sizeof sub, "%.150s.items", path);
        int c = compile(g, it, depth + 1, sub, err);
        if (c < 0) return -1;
        g->nodes[id].items = c;
    }
    return id;
}

tern_status srv_jgram_compile(const cJSON *schema, srv_jgram **out, tern_error *err) {
    *out = NULL;
    srv_jgram *g = calloc(1, sizeof *g);
    if (!g) return tern_err(err, TERN_ENOMEM, "out of memory");
    /* literals 0..2: true false null; node 0: any value */
    if (add_lit(g, "true", 4) < 0 || add_lit(g, "false", 5) < 0 || add_lit(g, "null", 4) < 0 || add_node(g, T_ANY) < 0) {
        srv_jgram_free(g);
        return tern_err(err, TERN_ENOMEM, "out of memory");
    }
    if (!schema) {
        g->root = add_node(g, T_OBJ);
    } else {
        tern_error e = {0};
        g->root = compile(g, schema, 0, "schema", &e);
        if (g->root < 0) {
            srv_jgram_free(g);
            return tern_err(err, e.code ? e.code : TERN_EINVAL, "%s", e.msg);
        }
    }
    if (g->root < 0) { srv_jgram_free(g); return tern_err(err, TERN_ENOMEM, "out of memory"); }
    *out = g;
    return TERN_OK;
}

/* ---- automaton ---------------------------------------------------------------------- */

static int is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static uint64_t lit_match(const srv_jgram *g, int lo, uint64_t cand, int pos, int c) {
    uint64_t out = 0;
    for (uint64_t m = cand; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        if ((size_t)pos < g->lit_len[lo + i] && (unsigned char)g->lit[lo + i][pos] == c) out |= 1ull << i;
    }
    return out;
}

static int lit_complete(const srv_jgram *g, const jstate *s) {
    for (uint64_t m = s->cand; m; m &= m - 1)
        if (g->lit_len[s->lit_lo + __builtin_ctzll(m)] == (size_t)s->pos) return __builtin_ctzll(m);
    return -1;
}

static uint64_t keys_left(const srv_jgram *g, const jframe *f) {
    int np = g->nodes[f->node].n_props;
    uint64_t all = np == 64 ? ~0ull : (1ull << np) - 1;
    return all & ~f->seen;
}

static int key_possible(const srv_jgram *g, const jframe *f) {
    return g->nodes[f->node].addl >= 0 || keys_left(g, f) != 0;
}

static void value_done(jstate *s) {
    s->lex = L_NONE;
    s->ws = 0;
    if (!s->depth) { s->done = 1; return; }
    jframe *f = &s->f[s->depth - 1];
    f->phase = f->phase == OP_VALUE ? OP_NEXT : AP_NEXT;
}

static int key_done(const srv_jgram *g, jstate *s, int prop) {
    jframe *f = &s->f[s->depth - 1];
    if (prop < 0 && g->nodes[f->node].addl < 0) return -1;
    f->prop = (int16_t)prop;
    if (prop >= 0) f->seen |= 1ull << prop;
    f->phase = OP_COLON;
    s->lex = L_NONE;
    s->ws = 0;
    return 0;
}

static int start_value(const srv_jgram *g, jstate *s, int node, int c) {
    const jnode *n = &g->nodes[node];
    s->ws = 0;
    if (n->n_enum) {
        uint64_t all = n->n_enum == 64 ? ~0ull : (1ull << n->n_enum) - 1;
        uint64_t m = lit_match(g, n->enum_lo, all, 0, c);
        if (!m) return -1;
        s->lex = L_LIT; s->lit_lo = (int16_t)n->enum_lo; s->cand = m; s->pos = 1; s->is_key = 0;
        return 0;
    }
    if (c == '{' && (n->types & T_OBJ)) {
        if (s->depth >= MAXD) return -1;
        jframe *f = &s->f[s->depth++];
        memset(f, 0, sizeof *f);
        f->node = (int16_t)node;
        f->prop = -1;
        f->phase = OP_KEY_OR_END;
        return 0;
    }
    if (c == '[' && (n->types & T_ARR)) {
        if (s->depth >= MAXD) return -1;
        jframe *f = &s->f[s->depth++];
        memset(f, 0, sizeof *f);
        f->node = (int16_t)node;
        f->prop = -1;
        f->phase = AP_VALUE_OR_END;
        return 0;
    }
    if (c == '"' && (n->types & T_STR)) { s->lex = L_STR; s->is_key = 0; s->u8need = 0; return 0; }
    if ((c == '-' || (c >= '0' && c <= '9')) && (n->types & (T_NUM | T_INT))) {
        s->lex = L_NUM;
        s->is_int = !(n->types & T_NUM);
        s->numlen = 1;
        s->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        return 0;
    }
    int li = (c == 't' && (n->types & T_BOOL)) ? 0 : (c == 'f' && (n->types & T_BOOL)) ? 1
           : (c == 'n' && (n->types & T_NULL)) ? 2 : -1;
    if (li < 0) return -1;
    s->lex = L_LIT; s->lit_lo = 0; s->cand = 1ull << li; s->pos = 1; s->is_key = 0;
    return 0;
}

static int start_key(const srv_jgram *g, jstate *s) {
    jframe *f = &s->f[s->depth - 1];
    const jnode *n = &g->nodes[f->node];
    uint64_t left = keys_left(g, f);
    s->lit_lo = (int16_t)n->key_lo;
    s->pos = 1;
    s->is_key = 1;
    s->ws = 0;
    if (n->addl < 0) {
        if (!left) return -1;
        s->lex = L_LIT;
        s->cand = left;
        return 0;
    }
    s->lex = L_STR;          /* free key: track which property it still could be */
    s->u8need = 0;
    s->cand = left;
    s->key_free = 1;
    return 0;
}

static int num_can_end(int sub) { return sub == N_ZERO || sub == N_INT || sub == N_FRAC || sub == N_EXPD; }

/* One byte. 0 ok, -1 error (s is then garbage: callers step copies). */
static int step(const srv_jgram *g, jstate *s, int c) {
    for (;;) {
        switch (s->lex) {
        case L_STR:
            if (s->u8need) {
                if (c < s->u8lo || c > s->u8hi) return -1;
                s->u8need--;
                s->u8lo = 0x80; s->u8hi = 0xBF;
                if (s->is_key) { s->cand = lit_match(g, s->lit_lo, s->cand, s->pos, c); s->pos++; }
                return 0;
            }
            if (c == '"') {
                if (!s->is_key) { value_done(s); return 0; }
                uint64_t m = lit_match(g, s->lit_lo, s->cand, s->pos, c);
                int prop = -1;
                for (; m; m &= m - 1)
                    if (g->lit_len[s->lit_lo + __builtin_ctzll(m)] == (size_t)s->pos + 1) prop = __builtin_ctzll(m);
                s->key_free = 0;
                return key_done(g, s, prop);
            }
            if (c == '\\') { s->lex = L_ESC; if (s->is_key) s->cand = 0; return 0; }
            if (c < 0x20) return -1;
            if (c >= 0x80) {
                if (c >= 0xC2 && c <= 0xDF) { s->u8need = 1; s->u8lo = 0x80; s->u8hi = 0xBF; }
                else if (c == 0xE0) { s->u8need = 2; s->u8lo = 0xA0; s->u8hi = 0xBF; }
                else if (c == 0xED) { s->u8need = 2; s->u8lo = 0x80; s->u8hi = 0x9F; }
                else if (c >= 0xE1 && c <= 0xEF) { s->u8need = 2; s->u8lo = 0x80; s->u8hi = 0xBF; }
                else if (c == 0xF0) { s->u8need = 3; s->u8lo = 0x90; s->u8hi = 0xBF; }
                else if (c >= 0xF1 && c <= 0xF3) { s->u8need = 3; s->u8lo = 0x80; s->u8hi = 0xBF; }
                else if (c == 0xF4) { s->u8need = 3; s->u8lo = 0x80; s->u8hi = 0x8F; }
                else return -1;
            }
            if (s->is_key) { s->cand = lit_match(g, s->lit_lo, s->cand, s->pos, c); s->pos++; }
            return 0;
        case L_ESC:
            if (c == 'u') { s->lex = L_U; s->sub = 0; return 0; }
            if (!strchr("\"\\/bfnrt", c) || !c) return -1;
            s->lex = L_STR;
            return 0;
        case L_U:
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
            if (++s->sub == 4) s->lex = L_STR;
            return 0;
        case L_NUM: {
            int d = c >= '0' && c <= '9', nx = -1;
            switch (s->sub) {
            case N_MINUS: nx = c == '0' ? N_ZERO : d ? N_INT : -1; if (nx < 0) return -1; break;
            case N_ZERO: nx = (!s->is_int && c == '.') ? N_DOT : (!s->is_int && (c == 'e' || c == 'E')) ? N_EXP : -1; break;
            case N_INT: nx = d ? N_INT : (!s->is_int && c == '.') ? N_DOT : (!s->is_int && (c == 'e' || c == 'E')) ? N_EXP : -1; break;
            case N_DOT: if (!d) return -1; nx = N_FRAC; break;
            case N_FRAC: nx = d ? N_FRAC : (c == 'e' || c == 'E') ? N_EXP : -1; break;
            case N_EXP: nx = (c == '+' || c == '-') ? N_EXPS : d ? N_EXPD : -1; if (nx < 0) return -1; break;
            case N_EXPS: if (!d) return -1; nx = N_EXPD; break;
            case N_EXPD: nx = d ? N_EXPD : -1; break;
            }
            if (nx >= 0) {
                /* a state that needs another byte (-, ., e, e+) only while one more fits: else a dead end (fuzzed) */
                if (++s->numlen > NUM_MAX || (s->numlen == NUM_MAX && !num_can_end(nx))) return -1;
                s->sub = (uint8_t)nx;
                return 0;
            }
            if (!num_can_end(s->sub)) return -1;
            value_done(s);
            continue;                                  /* c belongs to the container */
        }
        case L_LIT: {
            uint64_t m = lit_match(g, s->lit_lo, s->cand, s->pos, c);
            if (m) { s->cand = m; s->pos++; return 0; }
            int done = lit_complete(g, s);
            if (done < 0) return -1;
            if (s->is_key) { if (key_done(g, s, done)) return -1; }
            else value_done(s);
            continue;
        }
        default: break;
        }
        /* L_NONE: structure */
        if (is_ws(c)) { if (++s->ws > WS_MAX) return -1; return 0; }
        if (!s->depth) {
            if (s->done) return -1;
            return start_value(g, s, g->root, c);
        }
        jframe *f = &s->f[s->depth - 1];
        const jnode *n = &g->nodes[f->node];
        switch (f->phase) {
        case OP_KEY_OR_END:
        case OP_NEXT:
            if (c == '}') {
                if ((f->seen & n->required) != n->required) return -1;
                s->depth--;
                value_done(s);
                return 0;
            }
            if (f->phase == OP_KEY_OR_END && c == '"') return start_key(g, s);
            if (f->phase == OP_NEXT && c == ',' && key_possible(g, f)) { f->phase = OP_KEY; s->ws = 0; return 0; }
            return -1;
        case OP_KEY: return c == '"' ? start_key(g, s) : -1;
        case OP_COLON: if (c != ':') return -1; f->phase = OP_VALUE; s->ws = 0; return 0;
        case OP_VALUE: return start_value(g, s, f->prop >= 0 ? n->prop_node[f->prop] : n->addl, c);
        case AP_VALUE_OR_END:
        case AP_NEXT:
            if (c == ']') { s->depth--; value_done(s); return 0; }
            if (f->phase == AP_NEXT) { if (c != ',') return -1; f->phase = AP_VALUE; s->ws = 0; return 0; }
            f->phase = AP_VALUE;
            return start_value(g, s, n->items, c);
        case AP_VALUE: return start_value(g, s, n->items, c);
        }
        return -1;
    }
}

static int complete(const srv_jgram *g, const jstate *s) {
    if (s->depth) return 0;
    if (s->lex == L_NONE) return s->done;
    if (s->lex == L_NUM) return num_can_end(s->sub);
    if (s->lex == L_LIT) return lit_complete(g, s) >= 0;
    return 0;
}

/* ---- vocabulary trie ---------------------------------------------------------------- */

typedef struct tnode {
    uint8_t byte;
    uint16_t depth;              /* 1-based: bytes from the root */
    int end;                     /* index one past this node's subtree */
    int tok;                     /* first token ending here, -1 none (more via next_same) */
} tnode;

struct srv_jvocab {
    int n_vocab;
    tnode *nodes;
    int n_nodes;
    int *next_same;              /* [n_vocab] next token with the same bytes, -1 */
    char **bytes;                /* [n_vocab] */
    size_t *lens;
    int max_len;
    int eos[8], n_eos;
};

void srv_jvocab_free(srv_jvocab *v) {
    if (!v) return;
    if (v->bytes) for (int i = 0; i < v->n_vocab; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    free(v->nodes);
    free(v->next_same);
    free(v);
}

static const srv_jvocab *g_sort_v;
static int cmp_tok(const void *a, const void *b) {
    const srv_jvocab *v = g_sort_v;
    int x = *(const int *)a, y = *(const int *)b;
    size_t lx = v->lens[x], ly = v->lens[y], n = lx < ly ? lx : ly;
    int c = memcmp(v->bytes[x], v->bytes[y], n);
    if (c) return c;
    return lx < ly ? -1 : lx > ly ? 1 : x - y;
}

static pthread_mutex_t g_sort_mu = PTHREAD_MUTEX_INITIALIZER;

static tern_status build_trie(srv_jvocab *v, tern_error *err) {
    int *ord = malloc(sizeof(int) * (size_t)v->n_vocab);
    size_t total = 0;
    int n = 0;
    for (int i = 0; i < v->n_vocab; i++) {
        if (v->lens[i]) { total += v->lens[i]; n++; }
        if ((int)v->lens[i] > v->max_len) v->max_len = (int)v->lens[i];
    }
    v->nodes = malloc(sizeof(tnode) * (total + 1));
    v->next_same = malloc(sizeof(int) * (size_t)v->n_vocab);
    int *stack = malloc(sizeof(int) * (size_t)(v->max_len + 2));
    if (!ord || !v->nodes || !v->next_same || !stack) {
        free(ord); free(stack);
        return tern_err(err, TERN_ENOMEM, "json mask: out of memory");
    }
    n = 0;
    for (int i = 0; i < v->n_vocab; i++) { v->next_same[i] = -1; if (v->lens[i]) ord[n++] = i; }
    pthread_mutex_lock(&g_sort_mu);
    g_sort_v = v;
    qsort(ord, (size_t)n, sizeof(int), cmp_tok);
    pthread_mutex_unlock(&g_sort_mu);
    /* preorder nodes; stack[d] = node index at depth d+1 on the current path */
    int nn = 0, prev = -1;
    for (int k = 0; k < n; k++) {
        int t = ord[k];
        size_t lcp = 0;
        if (prev >= 0) {
            size_t lp = v->lens[prev], lt = v->lens[t];
            while (lcp < lp && lcp < lt && v->bytes[prev][lcp] == v->bytes[t][lcp]) lcp++;
            if (lcp == lp && lp == lt) {                 /* same bytes: chain to the same node */
                int nd = stack[lt - 1], x = v->nodes[nd].tok;
                while (v->next_same[x] >= 0) x = v->next_same[x];
                v->next_same[x] = t;
                prev = t;
                continue;
            }
        }
        for (size_t d = lcp; d < v->lens[t]; d++) {
            tnode *nd = &v->nodes[nn];
            nd->byte = (uint8_t)v->bytes[t][d];
            nd->depth = (uint16_t)(d + 1);
            nd->tok = -1;
            stack[d] = nn++;
        }
        v->nodes[stack[v->lens[t] - 1]].tok = t;
        prev = t;
    }
    v->n_nodes = nn;
    /* subtree ends: a node's subtree ends at the next node that is not deeper */
    int sp = 0;
    for (int i = 0; i < nn; i++) {
        while (sp && v->nodes[stack[sp - 1]].depth >= v->nodes[i].depth) v->nodes[stack[--sp]].end = i;
        stack[sp++] = i;
    }
    while (sp) v->nodes[stack[--sp]].end = nn;
    free(ord);
    free(stack);
    return TERN_OK;
}

tern_status srv_jvocab_from_bytes(const char *const *tokens, const size_t *lens, int n_vocab, const int *eos,
                                  int n_eos, srv_jvocab **out, tern_error *err) {
    *out = NULL;
    srv_jvocab *v = calloc(1, sizeof *v);
    if (!v || n_vocab <= 0) { free(v); return tern_err(err, TERN_EINVAL, "json mask: empty vocabulary"); }
    v->n_vocab = n_vocab;
    v->bytes = calloc((size_t)n_vocab, sizeof(char *));
    v->lens = calloc((size_t)n_vocab, sizeof(size_t));
    if (!v->bytes || !v->lens) { srv_jvocab_free(v); return tern_err(err, TERN_ENOMEM, "json mask: out of memory"); }
    for (int i = 0; i < n_vocab; i++) {
        size_t l = tokens[i] ? lens[i] : 0;
        if (l > 1024) l = 0;                            /* absurd token: never allowed */
        if (!l) continue;
        if (!(v->bytes[i] = malloc(l))) { srv_jvocab_free(v); return tern_err(err, TERN_ENOMEM, "json mask: out of memory"); }
        memcpy(v->bytes[i], tokens[i], l);
        v->lens[i] = l;
    }
    for (int i = 0; i < n_eos && v->n_eos < 8; i++)
        if (eos[i] >= 0 && eos[i] < n_vocab) v->eos[v->n_eos++] = eos[i];
    tern_status st = build_trie(v, err);
    if (st) { srv_jvocab_free(v); return st; }
    *out = v;
    return TERN_OK;
}

/* ---- matcher ------------------------------------------------------------------------ */

typedef struct mcache {
    uint64_t hash;
    size_t klen;
    unsigned char key[sizeof(jstate)];
    uint64_t *bits;              /* [ceil(n_vocab / 64)] allowed (EOS not included) */
    uint64_t used;
} mcache;

struct srv_jmatch {
    const srv_jgram *g;
    const srv_jvocab *v;
    jstate s;
    jstate *walk;                /* [max_len + 1] */
    mcache cache[N_CACHE];
    uint64_t tick;
    int words;
};

void srv_jmatch_free(srv_jmatch *m) {
    if (!m) return;
    for (int i = 0; i < N_CACHE; i++) free(m->cache[i].bits);
    free(m->walk);
    free(m);
}

tern_status srv_jmatch_new(const srv_jgram *g, const srv_jvocab *v, srv_jmatch **out, tern_error *err) {
    *out = NULL;
    srv_jmatch *m = calloc(1, sizeof *m);
    if (!m) return tern_err(err, TERN_ENOMEM, "json mask: out of memory");
    m->g = g;
    m->v = v;
    m->words = (v->n_vocab + 63) / 64;
    m->walk = malloc(sizeof(jstate) * (size_t)(v->max_len + 1));
    for (int i = 0; i < N_CACHE && m->walk; i++)
        if (!(m->cache[i].bits = malloc(sizeof(uint64_t) * (size_t)m->words))) break;
    if (!m->walk || !m->cache[N_CACHE - 1].bits) { srv_jmatch_free(m); return tern_err(err, TERN_ENOMEM, "json mask: out of memory"); }
    *out = m;
    return TERN_OK;
}

static void walk(srv_jmatch *m, uint64_t *bits) {
    const srv_jvocab *v = m->v;
    memset(bits, 0, sizeof(uint64_t) * (size_t)m->words);
    memcpy(&m->walk[0], &m->s, LIVE(&m->s));
    int i = 0;
    while (i < v->n_nodes) {
        const tnode *nd = &v->nodes[i];
        jstate *parent = &m->walk[nd->depth - 1], *cur = &m->walk[nd->depth];
        memcpy(cur, parent, LIVE(parent));
        if (step(m->g, cur, nd->byte)) { i = nd->end; continue; }
        for (int t = nd->tok; t >= 0; t = v->next_same[t]) bits[t >> 6] |= 1ull << (t & 63);
        i++;
    }
}

int srv_jmatch_mask(srv_jmatch *m, float *logits, int n_vocab) {
    size_t klen = LIVE(&m->s);
    uint64_t h = 1469598103934665603ull;
    const unsigned char *k = (const unsigned char *)&m->s;
    for (size_t i = 0; i < klen; i++) h = (h ^ k[i]) * 1099511628211ull;
    mcache *c = NULL, *lru = &m->cache[0];
    for (int i = 0; i < N_CACHE; i++) {
        mcache *x = &m->cache[i];
        if (x->used && x->hash == h && x->klen == klen && !memcmp(x->key, k, klen)) { c = x; break; }
        if (x->used < lru->used) lru = x;
    }
    if (!c) {
        c = lru;
        walk(m, c->bits);
        c->hash = h;
        c->klen = klen;
        memcpy(c->key, k, klen);
    }
    c->used = ++m->tick;
    int any = 0, n = n_vocab < m->v->n_vocab ? n_vocab : m->v->n_vocab;
    float eos_l[8];
    for (int i = 0; i < m->v->n_eos; i++) eos_l[i] = m->v->eos[i] < n_vocab ? logits[m->v->eos[i]] : 0;
    for (int w = 0; w * 64 < n; w++) {
        uint64_t b = c->bits[w];
        int lim = TERN_MIN(64, n - w * 64);
        if (b == ~0ull && lim == 64) { any = 1; continue; }
        for (int j = 0; j < lim; j++)
            if (!(b >> j & 1)) logits[w * 64 + j] = -INFINITY;
            else any = 1;
    }
    for (int i = n; i < n_vocab; i++) logits[i] = -INFINITY;
    int done = complete(m->g, &m->s);
    for (int i = 0; i < m->v->n_eos; i++)
        if (m->v->eos[i] < n_vocab) logits[m->v->eos[i]] = done ? eos_l[i] : -INFINITY;
    return any || done ? 0 : -1;
}

int srv_jmatch_feed(srv_jmatch *m, const char *b, size_t n) {
    jstate t;
    memcpy(&t, &m->s, LIVE(&m->s));
    for (size_t i = 0; i < n; i++)
        if (step(m->g, &t, (unsigned char)b[i])) return -1;
    memcpy(&m->s, &t, LIVE(&t));
    return 0;
}

int srv_jmatch_accept(srv_jmatch *m, int32_t tok) {
    if (tok < 0 || tok >= m->v->n_vocab) return -1;
    for (int i = 0; i < m->v->n_eos; i++)
        if (m->v->eos[i] == tok) return complete(m->g, &m->s) ? 0 : -1;
    if (!m->v->lens[tok]) return -1;
    return srv_jmatch_feed(m, m->v->bytes[tok], m->v->lens[tok]);
}

int srv_jmatch_complete(const srv_jmatch *m) { return complete(m->g, &m->s); }

/* ---- token bytes from a tokenizer ------------------------------------------------------ */

/* GPT-2 byte-level alphabet inverse: code point -> byte, -1 if not in the alphabet. */
static int bl_byte(int cp) {
    static int inv[324];
    static int init;
    if (!init) {
        for (int i = 0; i < 324; i++) inv[i] = -1;
        int extra = 0;
        for (int b = 0; b < 256; b++) {
            int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            inv[printable ? b : 256 + extra++] = b;
        }
        init = 1;
    }
    return cp >= 0 && cp < 324 ? inv[cp] : -1;
}

static int utf8_next(const unsigned char *s, size_t n, size_t *i) {
    unsigned c = s[*i];
    int need = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (need < 0 || *i + (size_t)need >= n + (need ? 0 : 1)) { (*i)++; return -1; }
    int cp = need == 0 ? (int)c : need == 1 ? (int)(c & 0x1F) : need == 2 ? (int)(c & 0x0F) : (int)(c & 0x07);
    for (int k = 1; k <= need; k++) cp = (cp << 6) | (s[*i + (size_t)k] & 0x3F);
    *i += (size_t)need + 1;
    return cp;
}

static int hexv(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/* The bytes a token contributes to the output: byte-level BPE maps its alphabet back to
 * bytes; SentencePiece-style vocabularies use "▁" for a space and <0xXX> for raw bytes. */
static size_t token_bytes(const char *t, size_t n, int byte_level, char *out) {
    const unsigned char *s = (const unsigned char *)t;
    size_t o = 0;
    if (byte_level) {
        size_t i = 0;
        while (i < n) {
            size_t i0 = i;
            int b = bl_byte(utf8_next(s, n, &i));
            if (b < 0) { memcpy(out + o, t + i0, i - i0); o += i - i0; } /* added token text */
            else out[o++] = (char)b;
        }
        return o;
    }
    if (n == 6 && t[0] == '<' && t[1] == '0' && t[2] == 'x' && t[5] == '>' && hexv(t[3]) >= 0 && hexv(t[4]) >= 0) {
        out[0] = (char)(hexv(t[3]) * 16 + hexv(t[4]));
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) { out[o++] = ' '; i += 2; }
        else out[o++] = t[i];
    }
    return o;
}

tern_status srv_jvocab_from_tokenizer(const tern_tokenizer *tok, int n_vocab, const int *eos, int n_eos,
                                      srv_jvocab **out, tern_error *err) {
    *out = NULL;
    if (!tok || n_vocab <= 0) return tern_err(err, TERN_EUNSUPPORTED, "json mask: the model has no tokenizer");
    int byte_level = tern_tokenizer_token_to_id(tok, "\xC4\xA0", 2) >= 0 || tern_tokenizer_token_to_id(tok, "\xC4\x8A", 2) >= 0;
    char **bytes = calloc((size_t)n_vocab, sizeof(char *));
    size_t *lens = calloc((size_t)n_vocab, sizeof(size_t));
    char *buf = malloc(4096);
    tern_status st = TERN_OK;
    if (!bytes || !lens || !buf) st = tern_err(err, TERN_ENOMEM, "json mask: out of memory");
    for (int i = 0; !st && i < n_vocab; i++) {
        size_t n = 0;
        const char *t = tern_tokenizer_id_to_token(tok, i, &n);
        if (!t || !n || n > 1024 || tern_tokenizer_is_special(tok, i)) continue;
        size_t l = token_bytes(t, n, byte_level, buf);
        if (!(bytes[i] = malloc(l ? l : 1))) { st = tern_err(err, TERN_ENOMEM, "json mask: out of memory"); break; }
        memcpy(bytes[i], buf, l);
        lens[i] = l;
    }
    if (!st) st = srv_jvocab_from_bytes((const char *const *)bytes, lens, n_vocab, eos, n_eos, out, err);
    if (bytes) for (int i = 0; i < n_vocab; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(buf);
    return st;
}
