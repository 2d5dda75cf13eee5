/*
 * jinja_int.h — internals shared by the jinja_*.c files (not a public header).
 *
 * Memory: everything (AST, values, strings) lives in an arena; a template owns one, each
 * render owns another that is dropped at the end. Nothing is freed individually, so errors
 * can unwind with longjmp (jj_fail) without leaking: the parser and the renderer each keep
 * a jmp_buf, and every allocation is bounded by the arena's cap.
 *
 * Values (jv) are small structs passed by value. Strings are (pointer, byte length) UTF-8,
 * immutable. Lists and dicts are reference objects (mutated by append / namespace set), as
 * in Python. Dicts keep insertion order; keys may be any value (usually strings).
 */
#ifndef TERN_JINJA_INT_H
#define TERN_JINJA_INT_H

#include "text/jinja.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- arena ---- */
typedef struct jj_chunk { struct jj_chunk *next; size_t used, cap; } jj_chunk;
typedef struct jj_arena {
    jj_chunk *head;
    size_t total, cap; /* bytes reserved so far, limit */
    jmp_buf *jb;       /* where to jump on exhaustion */
    tern_error *err;
} jj_arena;
void *jj_alloc(jj_arena *a, size_t n);
void jj_arena_free(jj_arena *a);
char *jj_strndup(jj_arena *a, const char *s, size_t n);
_Noreturn void jj_fail(jmp_buf *jb, tern_error *err, tern_status code, const char *fmt, ...) TERN_PRINTF(4, 5);

/* ---- values ---- */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_MACRO, JV_METHOD,
               JV_FUNC, JV_LOOP } jv_type;
struct jlist; struct jdict; struct jnode; struct jmacro; struct jmethod; struct jloop;
typedef struct jv {
    jv_type t;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        struct jlist *l;
        struct jdict *d;
        struct jmacro *m;
        struct jmethod *me;
        int fn; /* JV_FUNC: global function id */
        struct jloop *lp;
    } u;
} jv;
typedef struct jlist { jv *v; size_t n, cap; bool tuple; } jlist;
typedef struct jdict { jv *k, *v; size_t n, cap; bool ns; /* namespace() object */ } jdict;
typedef struct jmethod { jv self; const char *name; } jmethod;
typedef struct jloop { jlist *items; size_t i; int depth; } jloop;

/* ---- AST ---- */
typedef enum {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK, N_BREAK, N_CONTINUE,
    N_DO, N_BODY,
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_UNARY, N_BINARY, N_AND, N_OR, N_NOT, N_COND, N_COMPARE
} jnode_kind;

typedef struct jnode jnode;
typedef struct jargs {     /* call / filter / test arguments */
    jnode **pos; int npos;
    const char **kwname; jnode **kwval; int nkw;
} jargs;
struct jnode {
    jnode_kind kind;
    int line;
    const char *str; size_t len; /* N_TEXT text, N_NAME/N_GETATTR/N_FILTER/N_TEST name, op name */
    jv val;                      /* N_CONST */
    jnode *a, *b, *c;            /* operands / condition / sub-bodies */
    jnode **kids; int nkids;     /* N_BODY statements, N_LIST/N_TUPLE/N_DICT items (k,v pairs) */
    jargs args;                  /* N_CALL, N_FILTER, N_TEST, N_MACRO params (kwval = defaults) */
    const char **names; int nnames; /* N_FOR / N_SET targets */
    int op;                      /* operator char / flags */
    bool negate;                 /* N_TEST is not */
};
/* Operators (jnode.op for N_BINARY / N_COMPARE / N_UNARY). */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT,
       OP_GE, OP_IN, OP_NOTIN, OP_NEG, OP_POS };

struct tern_jinja_template {
    jj_arena arena;
    jnode *root;
    char name[64];
};

/* ---- render state ---- */
typedef struct jscope { struct jscope *parent; jdict *vars; } jscope;
/* Text buffers. The render's output and capture buffers grow by realloc (render frees them, also on an error's
 * longjmp); scratch buffers (JB_SCRATCH: a filter's or method's text) grow in the render arena instead, so a
 * jr_fail in the middle of one loses nothing, and are never free()d: jb_str hands their text over as is. */
typedef struct jbuf { char *p; size_t n, cap, max; struct jbuf *prev, *saved_out; jj_arena *ar; } jbuf;
#define JB_SCRATCH(r) {.ar = &(r)->arena}
typedef struct jrender {
    jj_arena arena;
    jmp_buf jb;
    tern_error *err;
    const char *tname;
    jbuf *out;
    jbuf *caps; /* active capture buffers */
    jscope *globals;
    tern_jinja_limits lim;
    uint64_t steps;
    int depth;
    int line;
    int loopctl; /* 0, 1 break, 2 continue */
} jrender;
_Noreturn void jr_fail(jrender *r, tern_status code, const char *fmt, ...) TERN_PRINTF(3, 4);

/* values (jinja_value.c) */
static inline jv jv_undef(void) { jv v = {JV_UNDEF, {0}}; return v; }
static inline jv jv_none(void) { jv v = {JV_NONE, {0}}; return v; }
static inline jv jv_bool(bool b) { jv v = {JV_BOOL, {0}}; v.u.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {JV_INT, {0}}; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = {JV_FLOAT, {0}}; v.u.f = f; return v; }
static inline jv jv_strn(const char *p, size_t n) { jv v = {JV_STR, {0}}; v.u.s.p = p; v.u.s.n = n; return v; }
static inline jv jb_str(const jbuf *b) { return b->p ? jv_strn(b->p, b->n) : jv_strn("", 0); } /* a JB_SCRATCH buffer's text */
jv jv_str_copy(jj_arena *a, const char *p, size_t n);
jv jv_cstr(const char *s); /* static string */
jv jv_new_list(jj_arena *a);
jv jv_new_dict(jj_arena *a);
void jv_list_push(jj_arena *a, jlist *l, jv v);
void jv_dict_set(jj_arena *a, jdict *d, jv k, jv v);
jv jv_dict_get(const jdict *d, jv k, bool *found);
jv jv_dict_gets(const jdict *d, const char *key);
bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
bool jv_is_num(jv v);
double jv_num(jv v);
int jv_cmp(jrender *r, jv a, jv b); /* <0 =0 >0 for numbers / strings / lists; error otherwise */
const char *jv_type_name(jv v);
jv jv_from_cjson(jj_arena *a, const cJSON *j);
void jb_put(jrender *r, jbuf *b, const char *s, size_t n);
void jv_write_str(jrender *r, jbuf *b, jv v);      /* Python str() */
void jv_write_repr(jrender *r, jbuf *b, jv v);     /* Python repr() */
jv jv_to_str(jrender *r, jv v);                    /* str() as a string value */
void jv_write_float(jbuf *b, double f, jrender *r);
typedef struct jjson_opt { bool ensure_ascii, sort_keys; int indent; /* <0 none */ const char *item_sep, *key_sep; } jjson_opt;
void jv_write_json(jrender *r, jbuf *b, jv v, const jjson_opt *o, int level);
size_t jj_utf8_len(const char *p, size_t n);       /* code points */
size_t jj_utf8_offset(const char *p, size_t n, int64_t cp); /* byte offset of code point cp (clamped) */

/* parser (jinja_parse.c) */
jnode *jj_parse(tern_jinja_template *t, const char *src, size_t len, jmp_buf *jb, tern_error *err);

/* evaluation (jinja_eval.c) */
jv jj_eval(jrender *r, jscope *sc, const jnode *n);
jv jj_call_value(jrender *r, jv fn, jv *pos, int npos, const char **kwn, jv *kwv, int nkw);
jv jj_getattr(jrender *r, jv obj, const char *name, size_t len);
jv jj_getitem(jrender *r, jv obj, jv key);
jv jj_as_list(jrender *r, jv v); /* iterate: list, dict keys, string chars; undefined -> [] */

/* builtins (jinja_builtins.c) */
enum { FN_RANGE = 1, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME, FN_CALLER_UNUSED };
int jj_global_fn(const char *name, size_t len); /* 0 if not a builtin global */
jv jj_call_global(jrender *r, int fn, jv *pos, int npos, const char **kwn, jv *kwv, int nkw);
jv jj_call_method(jrender *r, jv self, const char *name, jv *pos, int npos, const char **kwn, jv *kwv, int nkw);
bool jj_has_method(jv self, const char *name, size_t len);
jv jj_apply_filter(jrender *r, jscope *sc, const char *name, jv v, jv *pos, int npos, const char **kwn, jv *kwv,
                   int nkw);
bool jj_apply_test(jrender *r, const char *name, jv v, jv *pos, int npos);
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAP };
jv jj_str_case(jrender *r, jv s, int mode);
jv jj_str_strip(jrender *r, jv s, jv chars, bool left, bool right);
jv jj_str_replace(jrender *r, jv s, jv old, jv new_, int64_t count);
jv jj_dict_items(jrender *r, jdict *d);
jv jj_kwarg(const char **kwn, jv *kwv, int nkw, const char *name, jv *pos, int npos, int idx, jv def);
int64_t jj_want_int(jrender *r, jv v, const char *what);

#endif
