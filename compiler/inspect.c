/*
 * inspect.c: what will run, for people (kiln inspect, kiln compile --report).
 *
 * Every view is read off the compiled Program, after planning and
 * scheduling, so it shows exactly the schedule the generated C holds:
 *
 *   text   one row per dispatch (node, op, kernel, workgroups, bytes read and
 *          written, the arena ranges it writes, the barrier before it and
 *          why), then a summary;
 *   json   the same, complete, in the schema "kiln-inspect/1" (docs/cli.md);
 *   dot    dispatches as a graph: data dependencies as edges, barriers as
 *          dashed red edges, the dispatches of one node in one cluster;
 *   html   one self-contained page: the schedule table (coloured by GPU
 *          time when a profile is given) and an SVG memory map, x the
 *          schedule step, y the arena offset, one rectangle per tensor
 *          lifetime with its name, shape and bytes on hover.
 */
#include "kiln.h"

#include <stdio.h>
#include <string.h>

static const char *human(uint64_t b) {
    if (b < 10 * 1024)
        return format("%llu B", (unsigned long long)b);
    if (b < 10 * 1024 * 1024)
        return format("%.1f KiB", (double)b / 1024);
    if (b < 10ull * 1024 * 1024 * 1024)
        return format("%.1f MiB", (double)b / (1024 * 1024));
    return format("%.1f GiB", (double)b / (1024.0 * 1024 * 1024));
}

/* How many kernels have a second build (Module.alt_words). */
static int alt_count(const Program *p) {
    int n = 0;
    for (int i = 0; i < p->nmodules; i++)
        n += p->modules[i].alt_nwords > 0;
    return n;
}

static int barrier_count(const Program *p) {
    int n = 0;
    for (int i = 0; i < p->ndispatches; i++)
        n += p->dispatches[i]->barrier;
    return n;
}

/* The arena bytes a dispatch writes, "name [begin, end)" each, the dtype
 * after the name where it is not f32 ("name f16 [begin, end)"). */
static char *writes_of(const Dispatch *d) {
    Str s = {0};
    str_add(&s, "");
    for (int k = 0; k < d->nargs; k++) {
        if (!((d->writes >> k) & 1u))
            continue;
        kiln_dtype dt = d->args[k]->dtype;
        const char *type = dt == KILN_DTYPE_F32 ? "" : format(" %s", kiln_dtype_name(dt));
        str_addf(&s, "%s%s%s [%llu, %llu)", s.len ? ", " : "", d->args[k]->name, type,
                 (unsigned long long)(tensor_base(d->args[k]) + d->arg_begin[k]),
                 (unsigned long long)(tensor_base(d->args[k]) + d->arg_end[k]));
    }
    return s.buf;
}

typedef struct Totals {
    uint64_t flops, bytes;
} Totals;

static Totals totals(const Program *p) {
    Totals t = {0, 0};
    for (int i = 0; i < p->ndispatches; i++) {
        t.flops += p->dispatches[i]->flops;
        t.bytes += dispatch_bytes_read(p->dispatches[i]) +
                   dispatch_bytes_written(p->dispatches[i]);
    }
    return t;
}

void inspect_table(Program *p, Str *s) {
    str_addf(s, "%4s  %-22s %-12s %-16s %-13s %10s %10s  %-32s %s\n", "#", "node", "op",
             "kernel", "groups", "read", "written", "writes (arena bytes)", "barrier before");
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        char *groups = format("%ux%ux%u", d->groups[0], d->groups[1], d->groups[2]);
        char *kernel = format("k%d %s", d->module, d->family);
        char *barrier = d->barrier ? format("after #%d: %s", d->wait_on, d->reason) : "-";
        str_addf(s, "%4d  %-22s %-12s %-16s %-13s %10s %10s  %-32s %s\n", i, d->label,
                 op_info[d->node->op].name, kernel, groups, human(dispatch_bytes_read(d)),
                 human(dispatch_bytes_written(d)), writes_of(d), barrier);
    }
}

void inspect_text(Graph *g, Program *p, FILE *f, bool why) {
    fprintf(f, "model %s (%s)\n\n", g->name, g->path);
    Str table = {0};
    str_add(&table, "");
    inspect_table(p, &table);
    fputs(table.buf, f);
    Totals t = totals(p);
    fprintf(f, "\ndispatches  %d, with %d barriers\n", p->ndispatches, barrier_count(p));
    DeviceCounts dc = device_counts(p);
    if (dc.most < dc.listed) /* a device records one of each pair of variants */
        fprintf(f, "            %s run on one device; the others are variants for devices "
                "with other features\n", dc.fewest == dc.most ? format("%d", dc.most)
                : format("%d to %d, by its features,", dc.fewest, dc.most));
    fprintf(f, "kernels     %d distinct, %llu bytes of SPIR-V", p->nmodules,
            (unsigned long long)spirv_bytes(p));
    if (alt_count(p))
        fprintf(f, " (%d also built for subgroup arithmetic)", alt_count(p));
    fputc('\n', f);
    fprintf(f, "arena       %llu bytes; lower bound (peak live bytes) %llu (%.0f%%)\n",
            (unsigned long long)p->arena_bytes, (unsigned long long)p->peak_bytes,
            p->arena_bytes ? 100.0 * (double)p->peak_bytes / (double)p->arena_bytes : 100.0);
    fprintf(f, "weights     %llu bytes; staging %llu bytes\n",
            (unsigned long long)p->weight_bytes, (unsigned long long)p->io_bytes);
    fprintf(f, "work        about %.3g GFLOP, %s moved\n", (double)t.flops / 1e9,
            human(t.bytes));
    if (g->ndims) {
        fprintf(f, "dims       ");
        for (int i = 0; i < g->ndims; i++)
            fprintf(f, " %s %lld..%lld%s%s", g->dims[i].name, (long long)g->dims[i].lo,
                    (long long)g->dims[i].hi, g->dims[i].op ? " (derived)" : "",
                    i + 1 < g->ndims ? "," : "");
        fprintf(f, "; %d dispatches follow them (indirect), sizes above at the largest\n",
                p->nindirect);
    }
    for (int i = 0; i < g->states.len; i++) {
        Tensor *s = g->states.data[i];
        fprintf(f, "state       %s: %s %s, %s on the device, %s\n", s->name,
                kiln_dtype_name(s->dtype),
                shape_str(s->rank, s->shape), human(slot_bytes(s)),
                !s->update ? "written by the host only"
                : tensor_root(s->update) == s ? format("appended in place by '%s'",
                                                        s->update->name)
                : format("copied from '%s' after each run", s->update->name));
    }
    if (!why)
        return;
    /* -v: the rule that chose each product's kernel (lower_matmul.c), once
     * for a dispatch and the variants after it */
    fprintf(f, "\nwhy each product got its kernel:\n");
    for (int i = 0; i < p->ndispatches; i++) {
        const Dispatch *d = p->dispatches[i];
        if (d->why && !(i > 0 && p->dispatches[i - 1]->why == d->why))
            fprintf(f, "  #%d %s: %s\n", i, d->node->name, d->why);
    }
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 32)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_shape(FILE *f, const Tensor *t) {
    fputc('[', f);
    for (int i = 0; i < t->rank; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    fputc(']', f);
}

static const char *kind_name(const Tensor *t) {
    if (t->is_output)
        return "output";
    return t->kind == T_INPUT ? "input" : t->kind == T_WEIGHT ? "weight" : "intermediate";
}

/* Tensors with bytes somewhere: every root in use, and views of them. */
static bool placed(const Tensor *t) {
    const Tensor *r = t;
    while (r->alias)
        r = r->alias;
    if (r->kind == T_WEIGHT)
        return r->offset != UINT64_MAX;
    return r->last >= r->first;
}

void inspect_json(Graph *g, Program *p, FILE *f) {
    Totals t = totals(p);
    DeviceCounts dc = device_counts(p);
    fprintf(f, "{\n  \"schema\": \"kiln-inspect/1\",\n  \"model\": ");
    json_string(f, g->name);
    fprintf(f, ",\n  \"source\": ");
    json_string(f, g->path);
    fprintf(f, ",\n  \"summary\": {\"dispatches\": %d, \"barriers\": %d, \"kernels\": %d, "
               "\"spirv_bytes\": %llu, \"arena_bytes\": %llu, \"peak_live_bytes\": %llu, "
               "\"weight_bytes\": %llu, \"staging_bytes\": %llu, \"alignment\": %llu, "
               "\"flops\": %llu, \"bytes_moved\": %llu, \"most_on_one_device\": %d, "
               "\"fewest_on_one_device\": %d},\n",
            p->ndispatches, barrier_count(p), p->nmodules, (unsigned long long)spirv_bytes(p),
            (unsigned long long)p->arena_bytes, (unsigned long long)p->peak_bytes,
            (unsigned long long)p->weight_bytes, (unsigned long long)p->io_bytes,
            (unsigned long long)p->alignment, (unsigned long long)t.flops,
            (unsigned long long)t.bytes, dc.most, dc.fewest);
    static const char *const dim_ops[] = {NULL, "mul", "div", "max", "min"};
    fprintf(f, "  \"dims\": [");
    for (int i = 0; i < g->ndims; i++) {
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        json_string(f, g->dims[i].name);
        fprintf(f, ", \"min\": %lld, \"max\": %lld, \"derived\": ",
                (long long)g->dims[i].lo, (long long)g->dims[i].hi);
        if (g->dims[i].op)
            json_string(f, dim_ops[g->dims[i].op]);
        else
            fputs("null", f);
        fputc('}', f);
    }
    fprintf(f, "%s],\n  \"kernels\": [", g->ndims ? "\n  " : "");
    for (int i = 0; i < p->nmodules; i++) {
        fprintf(f, "%s\n    {\"index\": %d, \"family\": ", i ? "," : "", i);
        json_string(f, p->modules[i].family);
        fprintf(f, ", \"spirv_bytes\": %zu, \"defines\": ", p->modules[i].nwords * 4);
        json_string(f, p->modules[i].defines);
        if (p->modules[i].alt_nwords)
            fprintf(f, ", \"alt_spirv_bytes\": %zu, \"alt_needs\": %u",
                    p->modules[i].alt_nwords * 4, p->modules[i].alt_needs);
        fputc('}', f);
    }
    fprintf(f, "\n  ],\n  \"tensors\": [");
    bool first = true;
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *x = g->tensors.data[i];
        if (!placed(x))
            continue;
        Tensor *r = tensor_root(x);
        fprintf(f, "%s\n    {\"name\": ", first ? "" : ",");
        first = false;
        json_string(f, x->name);
        fprintf(f, ", \"kind\": \"%s\", \"dtype\": \"%s\", \"shape\": ", kind_name(x),
                kiln_dtype_name(x->dtype));
        json_shape(f, x);
        if (x->dyn_axes) { /* each axis's extent at run time, null where fixed */
            fputs(", \"extents\": [", f);
            for (int k = 0; k < x->rank; k++) {
                fputs(k ? ", " : "", f);
                if (is_dyn(x, k))
                    json_string(f, dim_expr_str(g, &x->ext[k]));
                else
                    fputs("null", f);
            }
            fputc(']', f);
        }
        fprintf(f, ", \"bytes\": %llu, \"buffer\": \"%s\", \"offset\": %llu, \"view_of\": ",
                (unsigned long long)tensor_bytes(x),
                r->buffer == KILN_BUFFER_WEIGHTS ? "weights" : "arena",
                (unsigned long long)tensor_base(x));
        if (x->alias)
            json_string(f, r->name);
        else
            fputs("null", f);
        fprintf(f, ", \"first\": %d, \"last\": %d}", r->first, r->last);
    }
    fprintf(f, "\n  ],\n  \"dispatches\": [");
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        fprintf(f, "%s\n    {\"index\": %d, \"node\": ", i ? "," : "", i);
        json_string(f, d->label);
        fprintf(f, ", \"op\": \"%s\", \"kernel\": %d, \"family\": \"%s\", "
                   "\"groups\": [%u, %u, %u], \"local_size\": %u, \"flops\": %llu, "
                   "\"bytes_read\": %llu, \"bytes_written\": %llu, \"args\": [",
                op_info[d->node->op].name, d->module, d->family, d->groups[0], d->groups[1],
                d->groups[2], d->local_size, (unsigned long long)d->flops,
                (unsigned long long)dispatch_bytes_read(d),
                (unsigned long long)dispatch_bytes_written(d));
        for (int k = 0; k < d->nargs; k++) {
            Tensor *r = tensor_root(d->args[k]);
            bool unused = d->arg_end[k] == d->arg_begin[k] && tensor_bytes(d->args[k]);
            fprintf(f, "%s{\"tensor\": ", k ? ", " : "");
            json_string(f, d->args[k]->name);
            fprintf(f, ", \"access\": \"%s\", \"buffer\": \"%s\", \"begin\": %llu, "
                       "\"end\": %llu}",
                    unused ? "none" : (d->writes >> k) & 1u ? "write" : "read",
                    r->buffer == KILN_BUFFER_WEIGHTS ? "weights" : "arena",
                    (unsigned long long)(tensor_base(d->args[k]) + d->arg_begin[k]),
                    (unsigned long long)(tensor_base(d->args[k]) + d->arg_end[k]));
        }
        fprintf(f, "], \"needs\": %u, \"unless\": %u, \"why\": ", d->needs, d->unless);
        if (d->why)
            json_string(f, d->why);
        else
            fputs("null", f);
        fputs(", \"barrier\": ", f);
        if (d->barrier) {
            fprintf(f, "{\"after\": %d, \"reason\": ", d->wait_on);
            json_string(f, d->reason);
            fputc('}', f);
        } else {
            fputs("null", f);
        }
        fputc('}', f);
    }
    fprintf(f, "\n  ]\n}\n");
}

/* The dispatch that last wrote tensor t's bytes before dispatch i, or -1. */
static int producer_before(const Program *p, int i, const Tensor *t) {
    const Tensor *r = t;
    while (r->alias)
        r = r->alias;
    for (int j = i - 1; j >= 0; j--) {
        Dispatch *d = p->dispatches[j];
        for (int k = 0; k < d->nargs; k++) {
            const Tensor *w = d->args[k];
            while (w->alias)
                w = w->alias;
            if (((d->writes >> k) & 1u) && w == r)
                return j;
        }
    }
    return -1;
}

void inspect_dot(Graph *g, Program *p, FILE *f) {
    fprintf(f, "digraph kiln {\n  label=");
    json_string(f, format("%s: %d dispatches, %d barriers", g->name, p->ndispatches,
                          barrier_count(p)));
    fprintf(f, ";\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    for (int i = 0; i < p->ndispatches;) {
        Dispatch *d = p->dispatches[i];
        int j = i;
        while (j < p->ndispatches && p->dispatches[j]->node == d->node)
            j++;
        if (j - i > 1) {
            fprintf(f, "  subgraph cluster_%d {\n    label=", i);
            json_string(f, format("%s (%s)", d->node->name, op_info[d->node->op].name));
            fprintf(f, ";\n");
        }
        for (int k = i; k < j; k++) {
            Dispatch *e = p->dispatches[k];
            fprintf(f, "    d%d [label=", k);
            json_string(f, format("#%d %s\\n%s, k%d %s\\n%ux%ux%u groups", k, e->label,
                                  op_info[e->node->op].name, e->module, e->family,
                                  e->groups[0], e->groups[1], e->groups[2]));
            fprintf(f, "];\n");
        }
        if (j - i > 1)
            fprintf(f, "  }\n");
        i = j;
    }
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        for (int k = 0; k < d->nargs; k++) {
            if (((d->writes >> k) & 1u) || d->arg_end[k] == d->arg_begin[k])
                continue;
            int src = producer_before(p, i, d->args[k]);
            if (src >= 0) {
                fprintf(f, "  d%d -> d%d [label=", src, i);
                json_string(f, d->args[k]->name);
                fprintf(f, "];\n");
            }
        }
        if (d->barrier) {
            fprintf(f, "  d%d -> d%d [style=dashed, color=red, fontcolor=red, label=\"barrier\"];\n",
                    d->wait_on, i);
        }
    }
    fprintf(f, "}\n");
}

static void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

void inspect_html(Graph *g, Program *p, const double *profile, int nprofile, FILE *f) {
    Totals t = totals(p);
    double total_us = 0, max_us = 0;
    for (int i = 0; i < nprofile; i++) {
        total_us += profile[i];
        if (profile[i] > max_us)
            max_us = profile[i];
    }
    fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>kiln: ");
    html_text(f, g->name);
    fprintf(f, "</title>\n<style>\n"
               "body{font:13px sans-serif;margin:20px;color:#222}\n"
               "table{border-collapse:collapse;font:12px monospace}\n"
               "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}\n"
               "th{background:#eee}td.n{text-align:right}\n"
               ".map rect{stroke:#333;stroke-width:0.5}.map rect:hover{stroke:#000;stroke-width:2}\n"
               ".legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}\n"
               "</style></head><body>\n<h1>");
    html_text(f, g->name);
    fprintf(f, "</h1>\n<p>%d dispatches, %d barriers, %d kernels (%llu bytes of SPIR-V); "
               "arena %llu bytes, lower bound %llu; weights %llu bytes; about %.3g GFLOP, %s "
               "moved.",
            p->ndispatches, barrier_count(p), p->nmodules, (unsigned long long)spirv_bytes(p),
            (unsigned long long)p->arena_bytes, (unsigned long long)p->peak_bytes,
            (unsigned long long)p->weight_bytes, (double)t.flops / 1e9, human(t.bytes));
    if (nprofile)
        fprintf(f, " Profiled GPU time %.1f us; rows are shaded by their share.", total_us);
    fprintf(f, "</p>\n<h2>Memory map</h2>\n");

    /* The map: each schedule step a column (inputs before step 0, outputs
     * after the last), the arena's bytes top to bottom. */
    int cols = p->ndispatches + 2;
    double W = 900, H = 420, cw = W / cols;
    double scale = p->arena_bytes ? H / (double)p->arena_bytes : 1;
    fprintf(f, "<svg class=\"map\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"-50 -20 %.0f %.0f\">\n",
            W + 60, H + 50, W + 60, H + 50);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.1f\" height=\"%.1f\" fill=\"#fafafa\"/>\n", W, H);
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *x = g->tensors.data[i];
        if (x->kind == T_WEIGHT || x->alias || x->last < x->first || !tensor_bytes(x))
            continue;
        double x0 = (x->first + 1) * cw, x1 = (x->last + 2) * cw;
        double y0 = (double)x->offset * scale, h = (double)tensor_bytes(x) * scale;
        if (h < 1)
            h = 1;
        const char *fill = x->kind == T_INPUT ? "#7aa6da" : x->is_output ? "#8cc68c"
                           : format("hsl(%d,60%%,70%%)", (i * 47) % 360);
        fprintf(f, "<rect data-tensor=\"");
        html_text(f, x->name);
        fprintf(f, "\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\">"
                   "<title>",
                x0, y0, x1 - x0, h, fill);
        html_text(f, format("%s: %s %s, %llu bytes at %llu, steps %d to %d", x->name,
                            kiln_dtype_name(x->dtype), shape_str(x->rank, x->shape),
                            (unsigned long long)tensor_bytes(x), (unsigned long long)x->offset,
                            x->first, x->last));
        fprintf(f, "</title></rect>\n");
    }
    fprintf(f, "<text x=\"-45\" y=\"8\" font-size=\"10\">0</text>"
               "<text x=\"-45\" y=\"%.0f\" font-size=\"10\">%s</text>\n",
            H, human(p->arena_bytes));
    fprintf(f, "<text x=\"0\" y=\"%.0f\" font-size=\"10\">inputs</text>"
               "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">schedule step &#8594;</text>"
               "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">outputs</text>\n",
            H + 14, W / 2, H + 14, W - 40, H + 14);
    fprintf(f, "</svg>\n<p class=\"legend\"><span style=\"background:#7aa6da\"></span>input"
               "<span style=\"background:#8cc68c\"></span>output"
               "<span style=\"background:hsl(200,60%%,70%%)\"></span>intermediate "
               "(hover a rectangle for its tensor)</p>\n");

    fprintf(f, "<h2>Schedule</h2>\n<table><tr><th>#</th><th>node</th><th>op</th>"
               "<th>kernel</th><th>groups</th><th>read</th><th>written</th>"
               "<th>writes (arena bytes)</th><th>barrier before</th>%s</tr>\n",
            nprofile ? "<th>us</th><th>share</th>" : "");
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        if (i < nprofile && max_us > 0)
            fprintf(f, "<tr data-dispatch=\"%d\" style=\"background:rgba(230,80,40,%.2f)\">",
                    i, 0.08 + 0.7 * profile[i] / max_us);
        else
            fprintf(f, "<tr data-dispatch=\"%d\">", i);
        fprintf(f, "<td class=\"n\">%d</td><td>", i);
        html_text(f, d->label);
        fprintf(f, "</td><td>%s</td><td>k%d %s</td><td>%ux%ux%u</td><td class=\"n\">%s</td>"
                   "<td class=\"n\">%s</td><td>",
                op_info[d->node->op].name, d->module, d->family, d->groups[0], d->groups[1],
                d->groups[2], human(dispatch_bytes_read(d)), human(dispatch_bytes_written(d)));
        html_text(f, writes_of(d));
        fprintf(f, "</td><td>");
        html_text(f, d->barrier ? format("after #%d: %s", d->wait_on, d->reason) : "-");
        fprintf(f, "</td>");
        if (i < nprofile)
            fprintf(f, "<td class=\"n\">%.2f</td><td class=\"n\">%.1f%%</td>", profile[i],
                    total_us > 0 ? 100 * profile[i] / total_us : 0);
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</table>\n</body></html>\n");
}

void compile_report(Graph *g, Program *p, uint64_t c_bytes, uint64_t runtime_bytes, FILE *f) {
    int nbind = 0;
    for (int i = 0; i < p->ndispatches; i++)
        nbind += p->dispatches[i]->nargs;
    /* The tables as the runtime's structs lay them out on a 64-bit host. */
    uint64_t schedule = (uint64_t)p->ndispatches * 48 + (uint64_t)nbind * 16 +
                        (uint64_t)p->nmodules * 40 +
                        (uint64_t)(g->inputs.len + g->outputs.len) * 112;
    fprintf(f, "size report for %s\n", g->name);
    fprintf(f, "  SPIR-V              %12llu bytes (%d kernels)\n",
            (unsigned long long)spirv_bytes(p), p->nmodules);
    fprintf(f, "  weights             %12llu bytes\n", (unsigned long long)p->weight_bytes);
    fprintf(f, "  schedule tables     %12llu bytes (%d dispatches, %d bindings)\n",
            (unsigned long long)schedule, p->ndispatches, nbind);
    fprintf(f, "  runtime library     %12llu bytes of code and data (libkilnrt)\n",
            (unsigned long long)runtime_bytes);
    fprintf(f, "  generated C source  %12llu bytes\n", (unsigned long long)c_bytes);
    fprintf(f, "device memory\n");
    fprintf(f, "  arena               %12llu bytes (lower bound %llu)\n",
            (unsigned long long)p->arena_bytes, (unsigned long long)p->peak_bytes);
    fprintf(f, "  weights             %12llu bytes\n", (unsigned long long)p->weight_bytes);
    fprintf(f, "  staging             %12llu bytes (inputs and outputs, host-visible)\n",
            (unsigned long long)p->io_bytes);
    fprintf(f, "  total               %12llu bytes\n",
            (unsigned long long)(p->arena_bytes + p->weight_bytes + p->io_bytes));
}
