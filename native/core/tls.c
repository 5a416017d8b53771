/* native/core/tls.c - part of the C core's one translation unit (see rmq_core.c).
 * TLS for the puller's connection (OpenSSL): a client context made from the query's settings
 * (rmq_tls_ctx_*) and the record I/O of one non-blocking socket, waiting with poll() until a
 * deadline. Python's ssl module speaks TLS on every other connection with the same settings
 * (rmq_source/remote/tls.py); both check the same things.
 */

#include <arpa/inet.h>
#include <poll.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <time.h>

struct rmq_tls_ctx {
    SSL_CTX *ctx;
    int verify;
};

/* The newest OpenSSL error as text ("" when none). */
static const char *tls_error_text(char *buf, size_t n) {
    unsigned long e = ERR_get_error();
    buf[0] = 0;
    if (e) ERR_error_string_n(e, buf, n);
    ERR_clear_error();
    return buf;
}

static int tls_password_cb(char *buf, int size, int rwflag, void *userdata) {
    const char *pw = userdata;
    if (!pw) return 0;
    size_t n = strlen(pw);
    if ((int)n > size) return 0;
    memcpy(buf, pw, n);
    return (int)n;
}

rmq_tls_ctx *rmq_tls_ctx_new(const char *ca_file, const char *cert_file, const char *key_file,
                             const char *key_password, int verify, rmq_error *err) {
    clear_err(err);
    char why[256];
    rmq_tls_ctx *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
        return NULL;
    }
    ERR_clear_error();
    t->verify = verify;
    t->ctx = SSL_CTX_new(TLS_client_method());
    if (!t->ctx) {
        set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "TLS context: %s", tls_error_text(why, sizeof why));
        free(t);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_options(t->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);   /* a close without close_notify
                                                                  is a close, as on plain TCP */
    const char *step = NULL;
    if (verify) {
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
        if (ca_file ? SSL_CTX_load_verify_locations(t->ctx, ca_file, NULL) != 1
                    : SSL_CTX_set_default_verify_paths(t->ctx) != 1)
            step = ca_file ? "loading the trusted CAs" : "loading the system's CAs";
    } else {
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_NONE, NULL);
    }
    if (!step && cert_file) {
        SSL_CTX_set_default_passwd_cb(t->ctx, tls_password_cb);
        SSL_CTX_set_default_passwd_cb_userdata(t->ctx, (void *)key_password);
        if (SSL_CTX_use_certificate_chain_file(t->ctx, cert_file) != 1)
            step = "loading the client certificate";
        else if (SSL_CTX_use_PrivateKey_file(t->ctx, key_file ? key_file : cert_file,
                                             SSL_FILETYPE_PEM) != 1)
            step = "loading the client key";
        else if (SSL_CTX_check_private_key(t->ctx) != 1)
            step = "matching the client key to its certificate";
        SSL_CTX_set_default_passwd_cb_userdata(t->ctx, NULL);   /* the password is not kept */
    }
    if (step) {
        set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "TLS context: %s", step);
        size_t n = strlen(err->message);
        snprintf(err->message + n, sizeof err->message - n, " failed: %s",
                 tls_error_text(why, sizeof why));
        SSL_CTX_free(t->ctx);
        free(t);
        return NULL;
    }
    return t;
}

void rmq_tls_ctx_free(rmq_tls_ctx *t) {
    if (!t) return;
    SSL_CTX_free(t->ctx);
    free(t);
}

static int64_t tls_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait until fd is ready for what SSL asked (ssl_err: SSL_ERROR_WANT_READ/WRITE) or deadline.
 * 0 ready, RMQ_E_TIMEOUT, or -errno. */
static int tls_wait(int fd, int ssl_err, int64_t deadline) {
    int64_t left = deadline - tls_now_ms();
    if (left <= 0) return RMQ_E_TIMEOUT;
    struct pollfd pf = {fd, ssl_err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN, 0};
    if (poll(&pf, 1, (int)(left > INT32_MAX ? INT32_MAX : left)) < 0 && errno != EINTR) return -errno;
    return 0;
}

/* Handshake on the connected socket fd (made non-blocking here). host: the name or IP address
 * the certificate must name (NULL: none checked). Returns the session or NULL with *err set
 * (RMQ_E_NET: refused or closed; RMQ_E_TIMEOUT). */
static SSL *tls_connect(rmq_tls_ctx *t, int fd, const char *host, int64_t deadline, rmq_error *err) {
    char why[256];
    ERR_clear_error();
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        set_err(err, RMQ_E_NET, NULL, -1, -1, -1, "TLS handshake failed: %s", strerror(errno));
        return NULL;
    }
    SSL *s = SSL_new(t->ctx);
    if (!s || SSL_set_fd(s, fd) != 1) {
        set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "TLS session: %s", tls_error_text(why, sizeof why));
        SSL_free(s);
        return NULL;
    }
    if (host && *host) {
        unsigned char ip[16];
        int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
        int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), host)
                       : (SSL_set_tlsext_host_name(s, host) == 1 && SSL_set1_host(s, host) == 1);
        if (!ok) {
            set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "TLS session: bad server name %s", host);
            SSL_free(s);
            return NULL;
        }
    }
    for (;;) {
        int r = SSL_connect(s);
        if (r == 1) return s;
        int e = SSL_get_error(s, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            int w = tls_wait(fd, e, deadline);
            if (w == 0) continue;
            if (w == RMQ_E_TIMEOUT)
                set_err(err, RMQ_E_TIMEOUT, NULL, -1, -1, -1, "%s",
                        "TLS handshake timed out (no answer from the server)");
            else
                set_err(err, RMQ_E_NET, NULL, -1, -1, -1, "TLS handshake failed: poll: %s", strerror(-w));
            SSL_free(s);
            return NULL;
        }
        long verify = SSL_get_verify_result(s);
        if (verify != X509_V_OK)
            set_err(err, RMQ_E_NET, NULL, -1, -1, -1,
                    "TLS handshake failed: the server's certificate was refused (%s)",
                    X509_verify_cert_error_string(verify));
        else if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN)
            set_err(err, RMQ_E_NET, NULL, -1, -1, -1, "%s",
                    "TLS handshake failed: the server closed the connection (does it speak TLS? "
                    "a server without tls.server.mode enforcing or permissive does not)");
        else
            set_err(err, RMQ_E_NET, NULL, -1, -1, -1, "TLS handshake failed: %s",
                    tls_error_text(why, sizeof why));
        SSL_free(s);
        return NULL;
    }
}

/* Write some of buf: bytes written (> 0), 0 when the socket must become writable first (*want
 * set), or -1 with *what describing the failure. */
static int64_t tls_write_some(SSL *s, const uint8_t *buf, int64_t len, int *want, const char **what) {
    size_t written = 0;
    ERR_clear_error();
    int r = SSL_write_ex(s, buf, (size_t)(len > INT32_MAX ? INT32_MAX : len), &written);
    if (r == 1) return (int64_t)written;
    int e = SSL_get_error(s, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) { *want = e; return 0; }
    *what = e == SSL_ERROR_SYSCALL ? "TLS send failed (connection broken)" : "TLS send failed";
    return -1;
}

/* Read some into buf: bytes read (> 0), 0 when the socket must become readable/writable first
 * (*want set), -2 when the server closed the connection, -1 with *what for a failure. */
static int64_t tls_read_some(SSL *s, uint8_t *buf, int64_t cap, int *want, const char **what) {
    size_t got = 0;
    ERR_clear_error();
    int r = SSL_read_ex(s, buf, (size_t)(cap > INT32_MAX ? INT32_MAX : cap), &got);
    if (r == 1) return (int64_t)got;
    int e = SSL_get_error(s, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) { *want = e; return 0; }
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) return -2;
    *what = "TLS record refused (corrupt or not TLS)";
    return -1;
}
