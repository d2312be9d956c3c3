/* --help and the flag reference table, both rendered from the flag table, with
 * the defaults read from the caller's struct so they show what the code
 * really uses. */
#include <inttypes.h>
#include <limits.h>
#include <string.h>

#include "flags.h"
#include "flags_internal.h"

#define HELP_WIDTH 80    /* help lines stay shorter than this */
#define HELP_MAX_COL 32  /* the text column, unless every flag ends sooner */
#define HELP_NBSP '\x1f' /* a space wrap() does not break at ("(default: 5m)") */

/* Reads an integer of `size` bytes (1, 2, 4 or 8), sign-extended when
 * `sig`; the bits of a signed target come back as its two's complement. */
static uint64_t read_int(const void *t, size_t size, bool sig)
{
  int8_t i8;
  int16_t i16;
  int32_t i32;
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;

  switch (size) {
  case 1:
    memcpy(&i8, t, 1);
    memcpy(&u8, t, 1);
    return sig ? (uint64_t)(int64_t)i8 : u8;
  case 2:
    memcpy(&i16, t, 2);
    memcpy(&u16, t, 2);
    return sig ? (uint64_t)(int64_t)i16 : u16;
  case 4:
    memcpy(&i32, t, 4);
    memcpy(&u32, t, 4);
    return sig ? (uint64_t)(int64_t)i32 : u32;
  default:
    memcpy(&u64, t, 8);
    return u64;
  }
}

static void show_int(const gs_flag_t *f, const void *t, char *buf, size_t len)
{
  uint64_t v = read_int(t, f->size, f->min < 0);

  if (f->min < 0)
    snprintf(buf, len, "%" PRId64, (int64_t)v);
  else
    snprintf(buf, len, "%" PRIu64, v);
}

static void show_addr(const gs_flag_t *f, const char *base, char *buf, size_t len)
{
  const char *host = base + f->off;
  uint16_t port;

  memcpy(&port, base + f->off2, sizeof(port));
  if (!strcmp(host, "0.0.0.0") || !host[0])
    snprintf(buf, len, ":%u", port);
  else if (strchr(host, ':'))
    snprintf(buf, len, "[%s]:%u", host, port);
  else
    snprintf(buf, len, "%s:%u", host, port);
}

/* The value `base` holds as text; true when it is a literal value (shown
 * as code in the flag reference) rather than words ("none", "off"). */
static bool show_value(const gs_flag_t *f, const void *base, char *buf, size_t len)
{
  const char *b = base, *t = b + f->off, *s;
  double d;
  float fl;
  uint64_t u = 0;

  buf[0] = '\0';
  switch (f->kind) {
  case GS_FLAG_BOOL:
    snprintf(buf, len, "%s", *(const bool *)t != f->negate ? "on" : "off");
    return false;
  case GS_FLAG_STR:
  case GS_FLAG_STRBUF:
    if (f->kind == GS_FLAG_STR)
      memcpy(&s, t, sizeof(s));
    else
      s = t;
    snprintf(buf, len, "%s", s && *s ? s : "none");
    return s && *s;
  case GS_FLAG_INT:
    show_int(f, t, buf, len);
    return true;
  case GS_FLAG_DOUBLE:
    if (f->size == sizeof(float)) {
      memcpy(&fl, t, sizeof(fl));
      d = fl;
    } else {
      memcpy(&d, t, sizeof(d));
    }
    snprintf(buf, len, "%g", d);
    return true;
  case GS_FLAG_SIZE:
  case GS_FLAG_DURATION:
    memcpy(&u, t, sizeof(u));
    gs__flags_show_u64(f->kind, u, buf, len);
    return true;
  case GS_FLAG_ENUM:
    u = read_int(t, f->size, false);
    for (uint64_t i = 0; f->names[i]; i++)
      if (i == u)
        snprintf(buf, len, "%s", f->names[i]);
    return true;
  case GS_FLAG_ADDR:
    show_addr(f, b, buf, len);
    return true;
  case GS_FLAG_CUSTOM:
    if (f->show)
      f->show(t, buf, len);
    return f->show != NULL;
  case GS_FLAG_SECTION:
    break;
  }
  return false;
}

/* The default as text; true when it is a literal value (shown as code in
 * the flag reference) rather than words ("none", "off", a .def). A switch's
 * default is "off" whatever it sets. */
static bool show_default(const gs_flag_t *f, const void *base, char *buf, size_t len)
{
  if (f->def || f->kind == GS_FLAG_BOOL) {
    snprintf(buf, len, "%s", f->def ? f->def : "off");
    return false;
  }
  return show_value(f, base, buf, len);
}

void gs_flags_show_default(const gs_flag_t *flag, const void *base, char *buf, size_t len)
{
  show_default(flag, base, buf, len);
}

/* "--name META", or "--name" for a switch; "--name, --alias META" with an
 * alias. */
static void flag_label(const gs_flag_t *f, char *buf, size_t len)
{
  char meta[128];
  const char *sep = f->alias ? ", " : "", *alias = f->alias ? f->alias : "";

  gs__flags_metavar(f, meta, sizeof(meta));
  if (f->kind == GS_FLAG_BOOL)
    snprintf(buf, len, "%s%s%s", f->name, sep, alias);
  else if (f->kind == GS_FLAG_ENUM && f->bare)
    snprintf(buf, len, "%s%s%s[=%s]", f->name, sep, alias, meta);
  else
    snprintf(buf, len, "%s%s%s %s", f->name, sep, alias, meta);
}

/* Copies s without backticks (markdown code spans) for the terminal. */
static void plain(const char *s, char *buf, size_t len)
{
  size_t n = 0;

  for (; *s && n + 1 < len; s++)
    if (*s != '`')
      buf[n++] = *s;
  buf[n] = '\0';
}

/* Writes `text` from column `col` on, wrapped at HELP_WIDTH; the cursor is
 * at column `at` of the current line. */
static void wrap(FILE *out, const char *text, size_t col, size_t at)
{
  const char *w = text;

  while (*w) {
    size_t n = strcspn(w, " ");

    if (at > col && at + 1 + n >= HELP_WIDTH) {
      fprintf(out, "\n%*s", (int)col, "");
      at = col;
    } else if (at > col) {
      fputc(' ', out);
      at++;
    }
    for (size_t k = 0; k < n; k++)
      fputc(w[k] == HELP_NBSP ? ' ' : w[k], out);
    at += n;
    w += n;
    while (*w == ' ')
      w++;
  }
  fputc('\n', out);
}

/* A short "(...)" at the end (a default, "required when N > 1") is not
 * broken across lines. */
static void keep_suffix_together(char *text)
{
  char *open = strrchr(text, '(');
  size_t n = open ? strlen(open) : 0;

  if (!open || n > 32 || open[n - 1] != ')')
    return;
  for (char *p = open; *p; p++)
    if (*p == ' ')
      *p = HELP_NBSP;
}

/* One source's name as shown: "$A", or "$A×$B" for a product "A*B"; in
 * code spans for the flag reference. */
static size_t source_name(const char *name, bool markdown, char *buf, size_t len)
{
  const char *tick = markdown ? "`" : "";
  size_t n = strcspn(name, "*");
  int w;

  if (name[n])
    w = snprintf(buf, len, "%s$%.*s%s×%s$%s%s", tick, (int)n, name, tick, tick, name + n + 1, tick);
  else
    w = snprintf(buf, len, "%s$%s%s", tick, name, tick);
  return w < 0 ? 0 : (size_t)w;
}

/* A .envs row's sources in order: "$A, $B or $C". */
static void source_list(const gs_flag_t *f, bool markdown, char *buf, size_t len)
{
  size_t used = 0;

  buf[0] = '\0';
  for (size_t i = 0; f->envs[i] && used + 1 < len; i++) {
    const char *sep = i == 0 ? "" : f->envs[i + 1] ? ", " : " or ";

    used += (size_t)snprintf(buf + used, len - used, "%s", sep);
    if (used + 1 < len)
      used += source_name(f->envs[i], markdown, buf + used, len - used);
  }
}

/* One flag's help: label, then its text and default from column col. */
static void help_row(const gs_flag_t *f, const void *base, size_t col, FILE *out)
{
  char label[192], def[256], text[1024], shown[1024], from[512];
  size_t at;

  flag_label(f, label, sizeof(label));
  show_default(f, base, def, sizeof(def));
  if (f->envs) {
    source_list(f, false, from, sizeof(from));
    snprintf(text, sizeof(text), "%s (from %s; %s%s)", f->help, from,
             f->required || !strncmp(def, "required", 8) ? "" : "default: ",
             f->required ? "required" : def);
  } else if (f->required)
    snprintf(text, sizeof(text), "%s (required)", f->help);
  else if (!strncmp(def, "required", 8))
    snprintf(text, sizeof(text), "%s (%s)", f->help, def);
  else if (f->kind != GS_FLAG_BOOL && def[0])
    snprintf(text, sizeof(text), "%s (default:%c%s)", f->help, HELP_NBSP, def);
  else
    snprintf(text, sizeof(text), "%s", f->help);
  plain(text, shown, sizeof(shown));
  keep_suffix_together(shown);
  fprintf(out, "  %s", label);
  at = 2 + strlen(label);
  if (at + 2 > col) {
    fprintf(out, "\n%*s", (int)col, "");
    at = col;
  } else {
    fprintf(out, "%*s", (int)(col - at), "");
    at = col;
  }
  wrap(out, shown, col, at);
}

/* The column flag texts start at: past the longest label, at most HELP_MAX_COL. */
static size_t text_column(const gs_flags_t *spec)
{
  char label[192];
  size_t col = 2 + strlen("-h, --help") + 2;

  for (size_t i = 0; i < spec->count; i++) {
    if (spec->flags[i].kind == GS_FLAG_SECTION)
      continue;
    flag_label(&spec->flags[i], label, sizeof(label));
    if (2 + strlen(label) + 2 > col)
      col = 2 + strlen(label) + 2;
  }
  return col > HELP_MAX_COL ? HELP_MAX_COL : col;
}

void gs_flags_help(const gs_flags_t *spec, const void *base, FILE *out)
{
  static const gs_flag_t version = {
      .name = "--version", .kind = GS_FLAG_BOOL, .help = "print the version and exit"};
  size_t col = text_column(spec);

  fputs(spec->usage, out);
  for (size_t i = 0; i < spec->count; i++) {
    if (spec->flags[i].kind == GS_FLAG_SECTION)
      fprintf(out, "%s\n", spec->flags[i].help);
    else
      help_row(&spec->flags[i], base, col, out);
  }
  help_row(&version, base, col, out);
  fprintf(out, "  -h, --help%*s", (int)(col - 12), "");
  wrap(out, "print this help and exit", col, col);
  if (spec->epilog)
    fprintf(out, "\n%s", spec->epilog);
}

/* Writes s with every '|' escaped, as a markdown table cell needs. */
static void cell(FILE *out, const char *s)
{
  for (; *s; s++) {
    if (*s == '|')
      fputc('\\', out);
    fputc(*s, out);
  }
}

void gs_flags_markdown(const gs_flags_t *spec, const void *base, FILE *out)
{
  char label[192], def[256];

  fputs("| flag | default | meaning |\n|---|---|---|\n", out);
  for (size_t i = 0; i < spec->count; i++) {
    const gs_flag_t *f = &spec->flags[i];
    bool literal;

    if (f->kind == GS_FLAG_SECTION)
      continue;
    flag_label(f, label, sizeof(label));
    literal = show_default(f, base, def, sizeof(def));
    fputs("| `", out);
    cell(out, label);
    fputs("` | ", out);
    if (f->envs) {
      char from[512];

      source_list(f, true, from, sizeof(from));
      fprintf(out, "%s, else ", from);
    }
    if (f->required)
      fputs("required", out);
    else if (literal)
      fprintf(out, "`%s`", def); /* values hold no '|' */
    else
      cell(out, def);
    fputs(" | ", out);
    cell(out, f->doc ? f->doc : f->help);
    fputs(" |\n", out);
  }
  fputs("| `--version`, `-h/--help` | | |\n", out);
}

/* Whether a secret row holds a value (a non-NULL or non-empty string). */
static bool secret_set(const gs_flag_t *f, const void *base)
{
  const char *t = (const char *)base + f->off, *s;

  if (f->kind != GS_FLAG_STR)
    return f->kind == GS_FLAG_STRBUF ? t[0] != '\0' : true;
  memcpy(&s, t, sizeof(s));
  return s && *s;
}

/* "; unused: $B=8, $C" : the row's sources set but lost to an earlier one
 * (values of secret rows left out). */
static void unused_sources(const gs_flag_t *f, const gs_flags_opts_t *opts, const char *used,
                           FILE *out)
{
  const char *one[2], *const *names = gs__flags_sources(f, one);
  bool first = true;
  char name[256];

  for (size_t k = 0; names[k]; k++) {
    const char *v = gs__flags_env(opts, names[k]);

    if (!v || names[k] == used)
      continue;
    source_name(names[k], false, name, sizeof(name));
    fprintf(out, "%s%s", first ? "; unused: " : ", ", name);
    if (!f->secret)
      fprintf(out, "=%s", v);
    first = false;
  }
}

/* A row's value for --print-config. A default the row describes in words
 * (.def: "none", "local rank mod GPUs visible") is shown as those words,
 * unless it is a string the code filled in (the host name). */
static void config_value(const gs_flag_t *f, const void *base, const char *src, char *buf,
                         size_t len)
{
  bool required = f->required || (f->def && !strncmp(f->def, "required", 8));

  if (!src && required)
    snprintf(buf, len, "(not set)");
  else if (f->secret)
    snprintf(buf, len, "%s", secret_set(f, base) ? "(hidden)" : "none");
  else if (show_value(f, base, buf, len) && src == NULL && f->def && f->kind != GS_FLAG_STR &&
           f->kind != GS_FLAG_STRBUF)
    plain(f->def, buf, len);
  else if (!src && f->def && !strcmp(buf, "none"))
    plain(f->def, buf, len);
}

void gs_flags_print_config(const gs_flags_t *spec, const void *base, const gs_flags_opts_t *opts,
                           FILE *out)
{
  char value[512], name[256];
  size_t width = 0;

  for (size_t i = 0; i < spec->count; i++)
    if (spec->flags[i].kind != GS_FLAG_SECTION && strlen(spec->flags[i].name) > width)
      width = strlen(spec->flags[i].name);
  for (size_t i = 0; i < spec->count; i++) {
    const gs_flag_t *f = &spec->flags[i];
    const char *src = opts && opts->sources ? opts->sources[i] : NULL;

    if (f->kind == GS_FLAG_SECTION)
      continue;
    config_value(f, base, src, value, sizeof(value));
    if (!src && !strcmp(value, "(not set)"))
      plain(f->required || !f->def ? "required" : f->def, name, sizeof(name));
    else if (!src)
      snprintf(name, sizeof(name), "default");
    else if (!strcmp(src, "flag"))
      snprintf(name, sizeof(name), "flag");
    else
      source_name(src, false, name, sizeof(name));
    fprintf(out, "%-*s  %-24s  %s", (int)width, f->name, value, name);
    if (opts && (f->env || f->envs))
      unused_sources(f, opts, src, out);
    fputc('\n', out);
  }
}

bool gs_flags_answer(const gs_flags_t *spec, const void *base, gs_flags_action_t action,
                     const char *version)
{
  switch (action) {
  case GS_FLAGS_HELP:
    gs_flags_help(spec, base, stdout);
    return true;
  case GS_FLAGS_MARKDOWN:
    gs_flags_markdown(spec, base, stdout);
    return true;
  case GS_FLAGS_VERSION:
    printf("%s %s\n", spec->prog, version);
    return true;
  case GS_FLAGS_RUN:
    break;
  }
  return false;
}
