/* Completions and chat completions (completion.h). */
#include "completion.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oai.h"
#include "service.h"
#include "slots.h"
#include "text.h"

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    conn *c;
    server *S;
    const oai_request *rq;
    char id[40];
    long created;
    int32_t *out;               /* generated ids (non-streaming and usage) */
    int n_out;
    double t_req, t_last;       /* request read; last token */
    double deadline_ms;         /* the answer's budget from t_req; <= 0 none */
    double elapsed_ms;          /* t_req to the end of generation */
    json_buf text;              /* non-streaming: the answer's text */
    json_buf reasoning;         /* non-streaming: a reasoning model's reasoning */
    json_buf chunk;             /* streaming: one event */
} completion;

static void chunk_head(completion *k) {
    json_buf *b = &k->chunk;
    jb_reset(b);
    jb_printf(b, "data: {\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", k->id,
              k->rq->chat ? "chat.completion.chunk" : "text_completion", k->created);
    jb_cstr(b, k->S->model_id);
    jb_puts(b, ", \"choices\": [");
}

static int send_chunk(completion *k) {
    jb_puts(&k->chunk, "\n\n");
    if (k->chunk.failed) return -1;
    return conn_send(k->c, k->chunk.buf, k->chunk.len);
}

static void usage_json(json_buf *b, int prompt, int completion) {
    jb_printf(b, "{\"prompt_tokens\": %d, \"completion_tokens\": %d, \"total_tokens\": %d}", prompt,
              completion, prompt + completion);
}

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    completion *k = user;
    server *S = k->S;
    if (id >= 0) {
        double t = now_ms();
        pthread_mutex_lock(&S->mu);
        if (k->n_out == 0) metrics_first_token(&S->m, (t - k->t_req) / 1e3);
        else metrics_next_token(&S->m, (t - k->t_last) / 1e3);
        S->m.generated_tokens++;
        pthread_mutex_unlock(&S->mu);
        if (k->n_out == 0) k->c->first_token_ms = t - k->t_req;
        k->t_last = t;
        k->out[k->n_out++] = id;
    }
    if (!k->rq->stream) {
        jb_raw(&k->text, text, len);
        return 0;
    }
    if (id < 0 && len == 0) return 0; /* the end, with no text held back */
    chunk_head(k);
    json_buf *b = &k->chunk;
    jb_puts(b, k->rq->chat ? "{\"index\": 0, \"delta\": {\"content\": " : "{\"index\": 0, \"text\": ");
    jb_str(b, text ? text : "", len);
    jb_puts(b, k->rq->chat ? "}, " : ", ");
    jb_puts(b, "\"logprobs\": null, \"finish_reason\": null, \"token_ids\": [");
    if (id >= 0) jb_printf(b, "%d", (int)id);
    jb_puts(b, "]}]}");
    return send_chunk(k) ? 1 : 0;
}

/* A reasoning model's reasoning (docs/serve.md): "reasoning_content", the field vLLM and
 * llama.cpp's server use, in the message or in a delta of its own. */
static int on_reasoning(void *user, const char *text, size_t len) {
    completion *k = user;
    if (!k->rq->stream) {
        jb_raw(&k->reasoning, text, len);
        return 0;
    }
    chunk_head(k);
    json_buf *b = &k->chunk;
    jb_puts(b, "{\"index\": 0, \"delta\": {\"reasoning_content\": ");
    jb_str(b, text, len);
    jb_puts(b, "}, \"logprobs\": null, \"finish_reason\": null}]}");
    return send_chunk(k) ? 1 : 0;
}

/* Stop waiting or generating: the drain deadline passed, or the client has gone. */
static int stop_now(conn *c) { return atomic_load(&c->S->cancel_all) || client_gone(c); }

static int gen_cancelled(void *user) { return stop_now(((completion *)user)->c); }

static int queue_stop(void *user) { return stop_now(user); }

static void stream_start(conn *c) {
    char head[512], cors[320];
    int n = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Cache-Control: no-cache\r\nConnection: close\r\n%s\r\n", conn_cors(c, cors, sizeof cors));
    c->status = 200;
    c->response_started = 1;
    conn_send(c, head, (size_t)n);
}

static void stream_finish(completion *k, int finish, const char *err) {
    json_buf *b = &k->chunk;
    if (finish == FINISH_ERROR) { /* mid-stream failure: an error event, and no [DONE] */
        oai_error e;
        oai_set_error(&e, 500, "server_error", NULL, NULL, "%s", err);
        jb_reset(b);
        jb_puts(b, "data: ");
        oai_error_json(b, &e);
        send_chunk(k);
        return;
    }
    chunk_head(k);
    if (k->rq->chat) jb_puts(b, "{\"index\": 0, \"delta\": {}, \"logprobs\": null, \"finish_reason\": ");
    else jb_puts(b, "{\"index\": 0, \"text\": \"\", \"logprobs\": null, \"finish_reason\": ");
    jb_printf(b, "\"%s\", \"token_ids\": []}]}", finish_name(finish));
    if (send_chunk(k)) return;
    if (k->rq->include_usage) {
        chunk_head(k);
        jb_puts(b, "], \"usage\": ");
        usage_json(b, k->c->prompt_tokens, k->n_out);
        jb_puts(b, "}");
        if (send_chunk(k)) return;
    }
    static const char done[] = "data: [DONE]\n\n";
    conn_send(k->c, done, sizeof done - 1);
}

static void respond_completion(completion *k, int finish) {
    json_buf b = {0};
    const oai_request *rq = k->rq;
    jb_printf(&b, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", k->id,
              rq->chat ? "chat.completion" : "text_completion", k->created);
    jb_cstr(&b, k->S->model_id);
    jb_puts(&b, ", \"choices\": [{\"index\": 0, ");
    if (rq->chat) {
        jb_puts(&b, "\"message\": {\"role\": \"assistant\", \"content\": ");
        jb_str(&b, k->text.buf ? k->text.buf : "", k->text.len);
        if (rq->reasoning) {
            jb_puts(&b, ", \"reasoning_content\": ");
            jb_str(&b, k->reasoning.buf ? k->reasoning.buf : "", k->reasoning.len);
        }
        jb_puts(&b, "}, ");
    } else {
        jb_puts(&b, "\"text\": ");
        jb_str(&b, k->text.buf ? k->text.buf : "", k->text.len);
        jb_puts(&b, ", ");
    }
    jb_printf(&b, "\"logprobs\": null, \"finish_reason\": \"%s\", \"token_ids\": [", finish_name(finish));
    for (int i = 0; i < k->n_out; i++) jb_printf(&b, "%s%d", i ? ", " : "", (int)k->out[i]);
    jb_puts(&b, "]}], \"usage\": ");
    usage_json(&b, k->c->prompt_tokens, k->n_out);
    if (k->deadline_ms > 0)
        jb_printf(&b, ", \"deadline\": {\"ms\": %g, \"elapsed_ms\": %.3f, \"missed\": %s}",
                  k->deadline_ms, k->elapsed_ms, k->elapsed_ms > k->deadline_ms ? "true" : "false");
    jb_puts(&b, "}");
    respond_json(k->c, 200, &b, NULL);
    jb_free(&b);
}

/* The checks a prompt's ids need: not empty, inside the vocabulary, room for max_tokens. Sets
 * *max_tokens (the default when not given). 0, or -1 with e set. */
static int check_prompt(const server *S, const oai_request *rq, long *max_tokens, oai_error *e) {
    int n = rq->n_ids;
    if (n <= 0) {
        oai_set_error(e, 400, "invalid_request_error", NULL, "prompt", "the prompt is empty");
        return -1;
    }
    for (int i = 0; i < n; i++)
        if ((uint32_t)rq->ids[i] >= S->info.vocab_size) {
            oai_set_error(e, 400, "invalid_request_error", NULL, "prompt",
                          "token id %d at index %d is outside the vocabulary (0..%u)", (int)rq->ids[i], i,
                          S->info.vocab_size - 1);
            return -1;
        }
    long room = (long)S->info.max_seq_len - n;
    long mt = rq->max_tokens >= 0 ? (long)rq->max_tokens : rq->chat ? room : (room < 16 ? room : 16);
    if (room < 1 || mt > room) {
        oai_set_error(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                      "This model's maximum context length is %u tokens. However, you requested "
                      "%ld tokens (%d in your prompt; %ld for the completion).",
                      S->info.max_seq_len, n + (mt > 0 ? mt : 1), n, mt > 0 ? mt : 1);
        return -1;
    }
    *max_tokens = mt;
    return 0;
}

/* What the request asks that this model cannot do at all (checked before queueing). */
static int check_model_can(const server *S, const oai_request *rq, oai_error *e) {
    int chat = rq->chat;
    if (strcmp(rq->model, S->model_id)) {
        oai_set_error(e, 404, "invalid_request_error", "model_not_found", "model",
                      "The model '%.100s' does not exist; this server serves '%s'", rq->model, S->model_id);
        return -1;
    }
    if (!S->tinfo.has_tokenizer) {
        const char *what = chat ? "chat messages" : rq->text ? "a text prompt" : rq->n_stop ? "'stop' strings" : NULL;
        if (what) {
            oai_set_error(e, 400, "invalid_request_error", "tokenizer_unavailable",
                          chat ? "messages" : rq->text ? "prompt" : "stop",
                          "this server has no tokenizer for model '%s', so it cannot take %s; "
                          "send the prompt as an array of token ids", S->model_id, what);
            return -1;
        }
    }
    if (chat && !S->has_chat_template) {
        oai_set_error(e, 400, "invalid_request_error", "chat_template_unavailable", "messages",
                      "model '%s' has no chat template (re-convert it from a checkpoint that has "
                      "one, or give one with --chat-template); use /v1/completions", S->model_id);
        return -1;
    }
    return 0;
}

/* A deadline: the request's deadline_ms, else --deadline-ms. An answer that was generated (not
 * cancelled, no error) counts; it missed when generation ended after it, queue time included. */
static void count_deadline(completion *k, int finish) {
    server *S = k->S;
    k->deadline_ms = k->rq->deadline_ms > 0 ? k->rq->deadline_ms
                     : S->o.deadline_ms > 0 ? (double)S->o.deadline_ms : -1;
    if (k->deadline_ms <= 0 || finish == FINISH_CANCELLED || finish == FINISH_ERROR) return;
    int missed = k->elapsed_ms > k->deadline_ms;
    pthread_mutex_lock(&S->mu);
    S->m.deadline_answered++;
    S->m.deadline_missed += (unsigned long long)missed;
    pthread_mutex_unlock(&S->mu);
    k->c->deadline_ms = k->deadline_ms;
    k->c->deadline_missed = missed;
}

/* After generation: the answer, or what stopped it. */
static void finish_answer(completion *k, int finish, const char *gerr) {
    conn *c = k->c;
    server *S = k->S;
    oai_error e;
    if (finish == FINISH_CANCELLED) {
        int shutting_down = atomic_load(&S->cancel_all);
        if (!shutting_down) {
            pthread_mutex_lock(&S->mu);
            S->m.cancelled++;
            pthread_mutex_unlock(&S->mu);
        }
        if (shutting_down && !client_gone(c)) {
            /* the drain deadline passed: say so instead of cutting the answer off silently */
            oai_set_error(&e, 503, "server_error", "shutting_down", NULL,
                          "the server is shutting down; generation stopped after %d tokens", k->n_out);
            if (k->rq->stream) {
                jb_reset(&k->chunk);
                jb_puts(&k->chunk, "data: ");
                oai_error_json(&k->chunk, &e);
                send_chunk(k);
                snprintf(c->err, sizeof c->err, "%s", e.message);
            } else {
                respond_error(c, &e);
            }
        } else {
            if (!k->rq->stream) c->status = 499; /* nginx's "client closed request": nothing sent */
            snprintf(c->err, sizeof c->err, "client disconnected; generation stopped");
        }
    } else if (k->rq->stream) {
        stream_finish(k, finish, gerr);
        if (finish == FINISH_ERROR) snprintf(c->err, sizeof c->err, "%s", gerr);
    } else if (finish == FINISH_ERROR) {
        oai_set_error(&e, 500, "server_error", NULL, NULL, "%s", gerr);
        respond_error(c, &e);
    } else {
        respond_completion(k, finish);
    }
}

/* Holding slot s (given back here, before the answer is written): the prompt's ids (tokenized
 * here when it is text, so tokenizing is bounded by --slots and skipped for a client that left
 * while queued), their checks, generation and the answer. 0, or -1 with e set (nothing sent). */
static int run_on_slot(conn *c, slot *s, oai_request *rq, uint64_t rid, double t_req, oai_error *e) {
    server *S = c->S;
    long max_tokens;
    if ((rq->chat && text_render_chat(s->ctx, S->pool.model, rq, e)) ||
        (!rq->chat && !rq->ids && text_tokenize(s->ctx, rq, 1, e)) || check_prompt(S, rq, &max_tokens, e)) {
        pool_release(&S->pool, s);
        return -1;
    }
    c->prompt_tokens = rq->n_ids;
    pthread_mutex_lock(&S->mu);
    S->m.prompt_tokens += (unsigned long long)rq->n_ids;
    pthread_mutex_unlock(&S->mu);

    completion k;
    memset(&k, 0, sizeof k);
    k.c = c;
    k.S = S;
    k.rq = rq;
    k.t_req = t_req; /* first-token latency counts the queue */
    k.created = (long)time(NULL);
    snprintf(k.id, sizeof k.id, "%s-%016llx", rq->chat ? "chatcmpl" : "cmpl", (unsigned long long)rid);
    k.out = malloc((size_t)max_tokens * sizeof *k.out);
    if (!k.out) {
        pool_release(&S->pool, s);
        oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    gen_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = (int)max_tokens;
    colibri_default_sampling(&p.sampling);
    p.sampling.temperature = (float)rq->temperature;
    p.sampling.top_p = (float)rq->top_p;
    p.sampling.seed = rq->seed_set ? rq->seed : rid;
    p.n_stop = rq->n_stop;
    for (int i = 0; i < rq->n_stop; i++) p.stop[i] = rq->stop[i];
    p.stop_ids = S->tinfo.stop_ids;
    p.n_stop_ids = S->tinfo.n_stop;
    p.text = S->tinfo.has_tokenizer;
    if (rq->chat) {
        p.reasoning = (colibri_reasoning_format)rq->reasoning;
        p.starts_in_reasoning = rq->starts_in_reasoning;
    }
    gen_callbacks cb = {on_token, gen_cancelled, &k, on_reasoning};
    char gerr[256] = "";
    if (rq->stream) {
        stream_start(c);
        if (rq->chat) { /* the first chunk carries the role, as OpenAI's does */
            chunk_head(&k);
            jb_puts(&k.chunk, "{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"content\": \"\"}, "
                              "\"logprobs\": null, \"finish_reason\": null}]}");
            send_chunk(&k);
        }
    }
    colibri_runtime_info before, after;
    colibri_get_runtime_info(s->ctx, &before); /* this thread holds the slot: its context */
    int finish = slot_generate(s, rq->ids, rq->n_ids, &p, &cb, gerr, sizeof gerr);
    k.elapsed_ms = now_ms() - t_req;
    colibri_get_runtime_info(s->ctx, &after);
    pthread_mutex_lock(&S->mu);
    S->m.gen_minor_faults += after.minor_faults - before.minor_faults;
    S->m.gen_major_faults += after.major_faults - before.major_faults;
    pthread_mutex_unlock(&S->mu);
    pool_release(&S->pool, s);
    count_deadline(&k, finish);
    c->completion_tokens = k.n_out;
    c->finish = finish_name(finish);
    finish_answer(&k, finish, gerr);
    free(k.out);
    jb_free(&k.text);
    jb_free(&k.reasoning);
    jb_free(&k.chunk);
    return 0;
}

void completion_serve(conn *c, int chat) {
    server *S = c->S;
    const char *body = c->buf + c->header_len;
    size_t len = (size_t)c->content_length;
    json_doc doc;
    oai_request rq;
    oai_error e;
    memset(&rq, 0, sizeof rq);
    if (json_parse(&doc, body, len)) {
        oai_set_error(&e, 400, "invalid_request_error", NULL, NULL,
                      "We could not parse the JSON body of your request: %s", doc.err);
        goto fail;
    }
    if (oai_decode(&doc, chat, &rq, &e)) goto fail;
    c->stream = rq.stream;
    if (check_model_can(S, &rq, &e)) goto fail;
    long max_tokens;
    if (rq.ids && check_prompt(S, &rq, &max_tokens, &e)) goto fail; /* ids: refused before queueing */

    pthread_mutex_lock(&S->mu);
    uint64_t rid = splitmix64(&S->id_state);
    pthread_mutex_unlock(&S->mu);
    double t_queue = now_ms();
    slot *s = NULL;
    int acq = pool_acquire(&S->pool, queue_stop, c, &s);
    c->queue_ms = now_ms() - t_queue;
    if (acq == ACQ_FULL) {
        pthread_mutex_lock(&S->mu);
        S->m.rejected_queue_full++;
        pthread_mutex_unlock(&S->mu);
        oai_set_error(&e, 503, "server_error", "queue_full", NULL,
                      "all %d slots are busy and %d requests are queued; retry later", S->pool.n, S->o.max_queue);
        goto fail;
    }
    if (acq == ACQ_GONE) {
        if (!client_gone(c)) { /* still there: the drain deadline passed while it waited */
            oai_set_error(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
            goto fail;
        }
        c->status = 499; /* nginx's "client closed request": nothing is sent */
        snprintf(c->err, sizeof c->err, "client left while queued");
        goto done;
    }
    if (run_on_slot(c, s, &rq, rid, t_queue, &e)) goto fail;
    goto done;
fail:
    respond_error(c, &e);
done:
    oai_request_free(&rq);
    json_free(&doc);
}
