/* main() of a Cuvil executable: parse the command line, check the plugins linked
 * in, load the inputs (.npy, images through the model's pre-processing, or raw
 * bytes through a plugin's pre-processor), run, write .json or .npy (or the
 * post-processing plugin's bytes).
 *
 * Exit codes: 0 ok, 1 bad input or runtime error, 2 usage error; every failure
 * is one line on stderr that starts with the program name, and leaves no output
 * file behind (outputs are written to a temporary file and renamed).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#if defined(__wasi__)
#include <unistd.h>
#endif

#include "cuvil_app.h"

#define EXIT_USAGE 2

static const char *prog = "model";

static int fail(int code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static int fail(int code, const char *fmt, ...) {
    char msg[2048];
    const char *c;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: ", prog);
    for (c = msg; *c; c++) { /* one line whatever the paths hold: control characters escaped */
        unsigned char ch = (unsigned char)*c;
        if (ch < 0x20 || ch == 0x7f) fprintf(stderr, "\\x%02x", ch);
        else fputc(ch, stderr);
    }
    if (code == EXIT_USAGE) fprintf(stderr, " (see %s --help)", prog);
    fputc('\n', stderr);
    return code;
}

static void print_tensor(const cuvil_tensor_desc *t) {
    int k;
    printf("  %-16s %s[", t->name, cuvil_dtype_name(t->dtype));
    for (k = 0; k < t->rank; k++) printf("%s%lld", k ? ", " : "", (long long)t->shape[k]);
    printf("]");
}

static void print_dims(const cuvil_model_desc *m) {
    int i;
    if (m->n_dims == 0) return;
    printf("symbolic dims (the shapes above are at their upper bounds; .npy inputs may use any value):\n");
    for (i = 0; i < m->n_dims; i++)
        printf("  %-16s [%lld, %lld]\n", m->dims[i].name, (long long)m->dims[i].min, (long long)m->dims[i].max);
}

/* The thread count without --threads: optimize.threads, baked in at build time. */
static int default_threads(const cuvil_app *app) {
    int n = app->default_threads;
    return n < 1 ? 1 : (n > CUVIL_MAX_THREADS ? CUVIL_MAX_THREADS : n);
}

static void print_help(const cuvil_app *app) {
    const cuvil_model_desc *m = app->model;
    int i;
    printf("usage: %s --input FILE [--input NAME=FILE ...] --output FILE.json|FILE.npy [--threads N] [--logits]\n\n",
           prog);
    printf("Runs the model '%s' compiled by Cuvil.\n\ninputs (.npy, little-endian, C order, exact shape and dtype):\n",
           m->prefix);
    for (i = 0; i < m->n_inputs; i++) {
        print_tensor(&m->inputs[i]);
        if (app->pre[i].kind == CUVIL_PRE_PLUGIN)
            printf("  or any file for the plugin '%s'\n", app->pre[i].plugin.plugin->name);
        else
            printf("%s\n", app->pre[i].kind == CUVIL_PRE_IMAGE ? "  or a JPEG/PNG image (pre-processed)" : "");
    }
    print_dims(m);
    printf("outputs:\n");
    for (i = 0; i < m->n_outputs; i++) {
        print_tensor(&m->outputs[i]);
        if (app->post[i].kind == CUVIL_POST_CLASSIFICATION) printf("  classification, top %d", app->post[i].top_k);
        printf("\n");
    }
    if (app->postprocess.plugin != NULL)
        printf("post-processing: the plugin '%s' writes --output (any name; .npy still writes the tensor)\n",
               app->postprocess.plugin->name);
    printf("\noptions:\n"
           "  --input FILE        an input, in the order above (repeat for each input)\n"
           "  --input NAME=FILE   the input called NAME\n"
           "  --output FILE       .json (top-k for classifiers, else all outputs) or .npy (one output)\n"
           "  --threads N         threads to run on (default %d: the config's optimize.threads)\n"
           "  --logits            add the raw logits to the JSON of a classifier\n"
           "  --help              this text\n"
           "\nexit status: 0 ok, 1 bad input or runtime error, 2 usage error\n",
           default_threads(app));
}

typedef struct {
    const char **inputs; /* one path per model input, NULL until given */
    const char *output;
    int threads, logits, help, npy;
} options;

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

/* The value of `--name VALUE` or `--name=VALUE` at argv[*i], or NULL if argv[*i] is not that option. */
static const char *option_value(int argc, char **argv, int *i, const char *name, int *missing) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static int assign_input(const cuvil_model_desc *m, options *o, const char *value) {
    const char *eq = strchr(value, '=');
    int i;
    if (eq != NULL) {
        for (i = 0; i < m->n_inputs; i++) {
            size_t len = (size_t)(eq - value);
            if (strlen(m->inputs[i].name) == len && strncmp(value, m->inputs[i].name, len) == 0) {
                if (o->inputs[i] != NULL) return fail(EXIT_USAGE, "input '%s' given twice", m->inputs[i].name);
                if (eq[1] == '\0') return fail(EXIT_USAGE, "--input %s: no file name after '='", value);
                o->inputs[i] = eq + 1;
                return 0;
            }
        }
    }
    for (i = 0; i < m->n_inputs; i++) { /* a plain FILE fills the first input not yet given */
        if (o->inputs[i] == NULL) {
            o->inputs[i] = value;
            return 0;
        }
    }
    return fail(EXIT_USAGE, "too many --input options: the model takes %d input%s", m->n_inputs,
                m->n_inputs == 1 ? "" : "s");
}

static int parse_args(const cuvil_app *app, int argc, char **argv, options *o) {
    const cuvil_model_desc *m = app->model;
    int i, rc;
    for (i = 1; i < argc; i++) {
        const char *v;
        int missing = 0;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            o->help = 1;
            return 0;
        } else if (strcmp(argv[i], "--logits") == 0) {
            o->logits = 1;
        } else if ((v = option_value(argc, argv, &i, "--input", &missing)) != NULL) {
            if ((rc = assign_input(m, o, v)) != 0) return rc;
        } else if ((v = option_value(argc, argv, &i, "--output", &missing)) != NULL) {
            if (o->output != NULL) return fail(EXIT_USAGE, "--output given twice");
            o->output = v;
        } else if ((v = option_value(argc, argv, &i, "--threads", &missing)) != NULL) {
            char *end;
            long n;
            errno = 0;
            n = strtol(v, &end, 10);
            if (errno || end == v || *end != '\0' || n < 1 || n > CUVIL_MAX_THREADS)
                return fail(EXIT_USAGE, "--threads must be an integer from 1 to %d, got '%s'", CUVIL_MAX_THREADS, v);
            o->threads = (int)n;
        } else if (missing) {
            return fail(EXIT_USAGE, "%s needs a value", argv[i]);
        } else {
            return fail(EXIT_USAGE, "unknown argument '%s'", argv[i]);
        }
    }
    for (i = 0; i < m->n_inputs; i++)
        if (o->inputs[i] == NULL) return fail(EXIT_USAGE, "missing --input for '%s'", m->inputs[i].name);
    if (o->output == NULL) return fail(EXIT_USAGE, "--output FILE.json or FILE.npy is required");
    if (ends_with(o->output, ".npy")) {
        o->npy = 1;
        if (m->n_outputs != 1)
            return fail(EXIT_USAGE, "the model has %d outputs and a .npy file holds one: write .json", m->n_outputs);
    } else if (!ends_with(o->output, ".json") && app->postprocess.plugin == NULL) {
        return fail(EXIT_USAGE, "--output '%s' must end in .json or .npy", o->output);
    }
    return 0;
}

/* Per input, the state of its pre-processing plugin; then the post-processor's. */
static void **pre_states = NULL;
static void *post_state = NULL;

/* Check every plugin linked in against this runtime, then initialise the hooks in
 * use. Returns 0 or an exit code (the message printed). */
static int start_plugins(const cuvil_app *app) {
    int i;
    for (i = 0; i < app->n_plugins; i++) {
        const cuvil_plugin *pl = app->plugins[i];
        char what[128];
        snprintf(what, sizeof what, "plugin '%s'", pl->name ? pl->name : "?");
        if (pl->abi_version != CUVIL_PLUGIN_ABI_VERSION || pl->size < sizeof(cuvil_plugin))
            return fail(EXIT_FAILURE, "%s was built for Cuvil plugin ABI %u, this executable's runtime (%s, Cuvil ABI "
                        "%d) speaks plugin ABI %d: rebuild the plugin against this cuvil_plugin.h", what,
                        (unsigned)pl->abi_version, CUVIL_TARGET_TRIPLE, CUVIL_ABI_VERSION, CUVIL_PLUGIN_ABI_VERSION);
        if (cuvil_check_signature(what, pl->signature) != CUVIL_OK) return fail(EXIT_FAILURE, "%s", cuvil_last_error());
    }
    for (i = 0; i < app->model->n_inputs; i++) {
        const cuvil_plugin_use *u = &app->pre[i].plugin;
        if (app->pre[i].kind != CUVIL_PRE_PLUGIN) continue;
        if (u->plugin->preprocess == NULL)
            return fail(EXIT_FAILURE, "plugin '%s' has no preprocess hook (input '%s')", u->plugin->name,
                        app->model->inputs[i].name);
        if (u->plugin->init != NULL && u->plugin->init(&pre_states[i], &u->options) != CUVIL_OK)
            return fail(EXIT_FAILURE, "plugin '%s' (input '%s'): %s", u->plugin->name, app->model->inputs[i].name,
                        cuvil_last_error());
    }
    if (app->postprocess.plugin != NULL) {
        const cuvil_plugin_use *u = &app->postprocess;
        if (u->plugin->postprocess == NULL)
            return fail(EXIT_FAILURE, "plugin '%s' has no postprocess hook", u->plugin->name);
        if (u->plugin->init != NULL && u->plugin->init(&post_state, &u->options) != CUVIL_OK)
            return fail(EXIT_FAILURE, "plugin '%s' (post-processing): %s", u->plugin->name, cuvil_last_error());
    }
    return 0;
}

static void stop_plugins(const cuvil_app *app) {
    int i;
    for (i = 0; pre_states != NULL && i < app->model->n_inputs; i++)
        if (app->pre[i].kind == CUVIL_PRE_PLUGIN && app->pre[i].plugin.plugin->destroy != NULL && pre_states[i])
            app->pre[i].plugin.plugin->destroy(pre_states[i]);
    if (app->postprocess.plugin != NULL && app->postprocess.plugin->destroy != NULL && post_state)
        app->postprocess.plugin->destroy(post_state);
}

/* Input i's shape for the run: a .npy file's own (a model with symbolic dims takes any
 * shape within its bounds), else (images, plugins) the model's with symbolic dims at 1. */
static cuvil_status shape_input(cuvil_ctx *ctx, const cuvil_model_desc *m, int i, const char *path, int npy) {
    int64_t dims[CUVIL_MAX_RANK];
    int rank = 0, k, off = 0;
    cuvil_status st;
    if (m->n_dims == 0) return CUVIL_OK;
    if (npy) {
        if ((st = cuvil_npy_shape(path, dims, &rank)) != CUVIL_OK) return st;
        return cuvil_ctx_set_input_shape(ctx, i, dims, rank);
    }
    for (k = 0; k < i; k++) off += m->inputs[k].rank;
    for (k = 0; k < m->inputs[i].rank; k++)
        dims[k] = m->input_dim_symbols[off + k] >= 0 ? 1 : m->inputs[i].shape[k];
    return cuvil_ctx_set_input_shape(ctx, i, dims, m->inputs[i].rank);
}

static int is_npy(const char *path, cuvil_status *st) {
    unsigned char magic[6] = {0};
    size_t size;
    FILE *f;
    if ((*st = cuvil_open_input(path, &f)) != CUVIL_OK) return 0;
    size = fread(magic, 1, sizeof magic, f);
    fclose(f);
    return size == sizeof magic && memcmp(magic, "\x93NUMPY", 6) == 0;
}

static cuvil_status load_input(const cuvil_app *app, cuvil_ctx *ctx, int i, const char *path, void *dst) {
    const cuvil_tensor_desc *t;
    uint8_t *data;
    size_t size;
    cuvil_status st;
    int npy = is_npy(path, &st);
    if (st != CUVIL_OK) return st;
    if ((st = shape_input(ctx, app->model, i, path, npy)) != CUVIL_OK) return st;
    t = cuvil_ctx_tensor(ctx, 0, i);
    if (npy) return cuvil_npy_load(path, t, dst);
    if (app->pre[i].kind == CUVIL_PRE_NONE) return cuvil_fail(CUVIL_ERR_FORMAT, "not a .npy file");
    if ((st = cuvil_read_file(path, CUVIL_IMAGE_MAX_FILE, &data, &size)) != CUVIL_OK) return st;
    if (app->pre[i].kind == CUVIL_PRE_PLUGIN) {
        const cuvil_plugin *pl = app->pre[i].plugin.plugin;
        cuvil_fail(CUVIL_ERR_FORMAT, "the plugin '%s' could not pre-process the file", pl->name);
        st = pl->preprocess(pre_states[i], data, size, t, dst);
    } else {
        st = cuvil_image_load(data, size, &app->pre[i], t, (float *)dst);
    }
    free(data);
    return st;
}

typedef struct {
    const cuvil_app *app;
    void *const *outputs;
    int logits;
} output_job;

static cuvil_status write_npy(FILE *f, void *arg) {
    output_job *job = (output_job *)arg;
    return cuvil_npy_write(f, &job->app->model->outputs[0], job->outputs[0]);
}

static cuvil_status write_to_file(void *self, const void *data, size_t size) {
    if (size > 0 && fwrite(data, 1, size, (FILE *)self) != size)
        return cuvil_fail(CUVIL_ERR_IO, "write failed");
    return CUVIL_OK;
}

static cuvil_status write_plugin(FILE *f, void *arg) {
    output_job *job = (output_job *)arg;
    const cuvil_model_desc *m = job->app->model;
    const cuvil_plugin *pl = job->app->postprocess.plugin;
    cuvil_writer w;
    cuvil_status st;
    w.write = write_to_file;
    w.self = f;
    cuvil_fail(CUVIL_ERR_IO, "the plugin '%s' could not post-process the outputs", pl->name);
    st = pl->postprocess(post_state, m->n_outputs, m->outputs, (const void *const *)job->outputs, &w);
    if (st != CUVIL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cuvil_last_error());
        return cuvil_fail(st, "plugin '%s': %s", pl->name, msg);
    }
    return CUVIL_OK;
}

static cuvil_status write_json(FILE *f, void *arg) {
    output_job *job = (output_job *)arg;
    return cuvil_json_write(f, job->app, job->outputs, job->logits);
}

/* Buffers for every tensor, 64-byte aligned (blocks[k] is what malloc returned). */
static int allocate(const cuvil_tensor_desc *t, int n, void **blocks, void **ptrs) {
    int i;
    for (i = 0; i < n; i++) {
        if (t[i].nbytes > (uint64_t)(SIZE_MAX - CUVIL_ARENA_ALIGN)) return 0;
        blocks[i] = malloc((size_t)t[i].nbytes + CUVIL_ARENA_ALIGN);
        if (blocks[i] == NULL) return 0;
        ptrs[i] = (uint8_t *)blocks[i] + (CUVIL_ARENA_ALIGN - (uintptr_t)blocks[i] % CUVIL_ARENA_ALIGN);
    }
    return 1;
}

static int run(const cuvil_app *app, const options *o, void **in, void **out) {
    const cuvil_model_desc *m = app->model;
    cuvil_model_desc shaped; /* the model with this run's tensor shapes, for the writers */
    cuvil_app shaped_app;
    output_job job;
    cuvil_ctx *ctx = NULL;
    cuvil_status st;
    struct stat sb;
    int i, rc = 0;
    if (stat(o->output, &sb) == 0 && S_ISDIR(sb.st_mode))
        return fail(EXIT_FAILURE, "output '%s' is a directory, not a file", o->output);
    if ((st = cuvil_ctx_create(m, &ctx)) != CUVIL_OK || (st = cuvil_ctx_set_threads(ctx, o->threads)) != CUVIL_OK) {
        cuvil_ctx_destroy(ctx);
        return fail(EXIT_FAILURE, "%s", cuvil_last_error());
    }
    for (i = 0; i < m->n_inputs; i++)
        if (load_input(app, ctx, i, o->inputs[i], in[i]) != CUVIL_OK) {
            rc = fail(EXIT_FAILURE, "input '%s' (%s): %s", m->inputs[i].name, o->inputs[i], cuvil_last_error());
            cuvil_ctx_destroy(ctx);
            return rc;
        }
    if ((st = cuvil_ctx_run(ctx, (const void *const *)in, out)) != CUVIL_OK) {
        cuvil_ctx_destroy(ctx);
        return fail(EXIT_FAILURE, "%s", cuvil_last_error());
    }
    shaped = *m;
    shaped_app = *app;
    if (m->n_dims > 0) {
        shaped.inputs = cuvil_ctx_tensor(ctx, 0, 0);
        shaped.outputs = cuvil_ctx_tensor(ctx, 1, 0);
        shaped_app.model = &shaped;
    }
    job.app = &shaped_app;
    job.outputs = out;
    job.logits = o->logits;
    if (cuvil_write_atomic(o->output, o->npy ? write_npy : app->postprocess.plugin ? write_plugin : write_json, &job) !=
        CUVIL_OK)
        rc = fail(EXIT_FAILURE, "output: %s", cuvil_last_error());
    cuvil_ctx_destroy(ctx);
    return rc;
}

int main(int argc, char **argv) {
    const cuvil_app *app = &cuvil_main_app;
    const cuvil_model_desc *m = app->model;
    int n = m->n_inputs + m->n_outputs, rc, i;
    void **mem = (void **)calloc((size_t)(2 * n + 1), sizeof(void *)); /* blocks, then aligned pointers */
    options o;
    if (argc > 0 && argv[0] != NULL && argv[0][0] != '\0') {
        const char *slash = strrchr(argv[0], '/');
        prog = slash ? slash + 1 : argv[0];
    }
#if defined(__wasi__)
    { /* WASI starts in "/": the runner passes the host's working directory */
        const char *pwd = getenv("PWD");
        if (pwd != NULL && pwd[0] == '/') chdir(pwd);
    }
#endif
    memset(&o, 0, sizeof o);
    o.threads = default_threads(app);
    o.inputs = (const char **)calloc((size_t)m->n_inputs + 1, sizeof(char *));
    pre_states = (void **)calloc((size_t)m->n_inputs + 1, sizeof(void *));
    if (mem == NULL || o.inputs == NULL || pre_states == NULL) return fail(EXIT_FAILURE, "out of memory");
    rc = parse_args(app, argc, argv, &o);
    if (rc == 0 && o.help) print_help(app);
    if (rc == 0 && !o.help) rc = start_plugins(app);
    if (rc == 0 && !o.help) {
        if (!allocate(m->inputs, m->n_inputs, mem, mem + n) ||
            !allocate(m->outputs, m->n_outputs, mem + m->n_inputs, mem + n + m->n_inputs))
            rc = fail(EXIT_FAILURE, "cannot allocate the model's input and output tensors");
        else
            rc = run(app, &o, mem + n, mem + n + m->n_inputs);
    }
    stop_plugins(app);
    for (i = 0; i < n; i++) free(mem[i]);
    free(mem);
    free(o.inputs);
    free(pre_states);
    return rc;
}
