/*
 * rdma_peer: the rxe side of `ibal qp-exchange --rdma-bulk SIZE` (issue 14, deliver 9).
 *
 * Written for ibal; uses only libibverbs. It opens an RDMA device (rxe0 in the
 * interop VM), registers a buffer of 2 * SIZE bytes open to REMOTE_WRITE and
 * REMOTE_READ, fills its second half with the bulk pattern of a random seed and
 * zeroes the first, creates an RC QP and then, as the TCP server of ibal's
 * qp-exchange side channel (docs/two-process.md):
 *
 *   read the client's 52-byte address "LLLL:QQQQQQ:PPPPPP:<32 hex GID>\0",
 *   move the QP to RTR and RTS, write our 52 bytes, read "done\0",
 *   write "ibal-qpx/1 mode=rc size=SIZE iters=1 seed=SS write=1 addr=A rkey=K bulk=SIZE\n",
 *   read the client's extension line (its seed and bulk=SIZE),
 *   wait for "ibal-qpx/1 bulk-done wrote=SIZE read=SIZE read_ok=0|1\n",
 *   check that the first half holds the client's pattern, and write the verdict
 *   "ibal-qpx/1 bulk-verdict ok checked=SIZE" or "... FAIL first mismatch at ..."
 *   to the client and (with "rdma_peer: ") to stdout.
 *
 * The bulk pattern (ibal's oob::bulk_byte): byte k is byte k % 4 (little-endian)
 * of the 32-bit word (k / 4) * 0x9E3779B1 ^ seed * 0x01010101.
 *
 * Every wait is bounded by -t seconds. Exit status: 0 both the WRITE we check and
 * the READ the client checked are right; 1 a data check failed (ours or the
 * client's); 2 usage or verbs setup error; 3 the side channel failed (timeout, EOF,
 * bad message).
 *
 * Build: gcc -O2 -Wall -o rdma_peer rdma_peer.c -libverbs
 * Run:   rdma_peer -d rxe0 -g 1 -p 18520 -b 1048576 -m 1024 -t 60
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MSG_LEN 52
#define MAX_LINE 512

static int timeout_s = 60;

static void say(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "rdma_peer: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
}

static uint8_t bulk_byte(uint8_t seed, size_t k)
{
	uint32_t w = (uint32_t)(k / 4) * 0x9E3779B1u ^ (uint32_t)seed * 0x01010101u;
	return (uint8_t)(w >> (8 * (k % 4)));
}

/* Where the little-endian word w would sit in the pattern of seed. */
static uint64_t bulk_origin(uint8_t seed, const uint8_t *w)
{
	uint32_t v = (uint32_t)w[0] | (uint32_t)w[1] << 8 | (uint32_t)w[2] << 16 |
		     (uint32_t)w[3] << 24;
	v ^= (uint32_t)seed * 0x01010101u;
	return (uint64_t)(uint32_t)(v * 0x0E8B2F51u) * 4;
}

/* 0 when buf holds the pattern, else 1 with a description in out. */
static int check(const uint8_t *buf, size_t len, uint8_t seed, size_t mtu, char *out,
		 size_t outlen)
{
	size_t at, k, bad = 0, w;
	for (at = 0; at < len; at++)
		if (buf[at] != bulk_byte(seed, at))
			break;
	if (at == len)
		return 0;
	for (k = at; k < len; k++)
		bad += buf[k] != bulk_byte(seed, k);
	w = at & ~(size_t)3;
	char origin[96] = "";
	if (w + 4 <= len) {
		static const uint8_t zero[4];
		uint64_t o = bulk_origin(seed, buf + w);
		if (!memcmp(buf + w, zero, 4))
			snprintf(origin, sizeof origin, "zeros there: nothing was placed");
		else if (o < len)
			snprintf(origin, sizeof origin, "the word there belongs at offset %llu",
				 (unsigned long long)o);
		else
			snprintf(origin, sizeof origin, "the word there is not from the pattern");
	}
	snprintf(out, outlen,
		 "first mismatch at offset %zu (packet %zu of %zu at MTU %zu): got 0x%02x, "
		 "expected 0x%02x; %s; %zu bytes differ from there on",
		 at, at / mtu, (len + mtu - 1) / mtu, mtu, buf[at], bulk_byte(seed, at), origin,
		 bad);
	return 1;
}

static int wait_fd(int fd, short ev)
{
	struct pollfd p = { .fd = fd, .events = ev };
	int r;
	do
		r = poll(&p, 1, timeout_s * 1000);
	while (r < 0 && errno == EINTR);
	return r > 0 ? 0 : -1;
}

static int read_full(int fd, void *buf, size_t len, const char *what)
{
	size_t got = 0;
	while (got < len) {
		if (wait_fd(fd, POLLIN)) {
			say("timed out after %d s %s (%zu of %zu bytes)", timeout_s, what, got, len);
			return -1;
		}
		ssize_t n = read(fd, (char *)buf + got, len - got);
		if (n == 0) {
			say("the peer closed the side channel %s (%zu of %zu bytes)", what, got, len);
			return -1;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			say("%s: %s", what, strerror(errno));
			return -1;
		}
		got += (size_t)n;
	}
	return 0;
}

static int read_line(int fd, char *line, const char *what)
{
	size_t n = 0;
	for (;;) {
		char c;
		if (read_full(fd, &c, 1, what))
			return -1;
		if (c == '\n')
			break;
		if (n + 1 >= MAX_LINE) {
			say("%s: line longer than %d bytes", what, MAX_LINE);
			return -1;
		}
		line[n++] = c;
	}
	line[n] = 0;
	return 0;
}

static int write_full(int fd, const void *buf, size_t len, const char *what)
{
	size_t put = 0;
	while (put < len) {
		ssize_t n = write(fd, (const char *)buf + put, len - put);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			say("%s: %s", what, strerror(errno));
			return -1;
		}
		put += (size_t)n;
	}
	return 0;
}

/* A "key=value" field of an extension line, or NULL. */
static const char *field(const char *line, const char *key)
{
	size_t kl = strlen(key);
	const char *p = line;
	while ((p = strstr(p, key))) {
		if ((p == line || p[-1] == ' ') && p[kl] == '=')
			return p + kl + 1;
		p += kl;
	}
	return NULL;
}

static enum ibv_mtu mtu_enum(int mtu)
{
	switch (mtu) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: rdma_peer [-d DEV] [-g GID_INDEX] [-l IP] [-p TCP_PORT] [-b SIZE]"
			" [-m MTU] [-t SECONDS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *devname = "rxe0", *listen_ip = "0.0.0.0";
	int gidx = 1, port = 18520, mtu = 1024, opt;
	size_t size = 1 << 20;
	while ((opt = getopt(argc, argv, "d:g:l:p:b:m:t:")) != -1) {
		switch (opt) {
		case 'd': devname = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'l': listen_ip = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'b': size = strtoull(optarg, NULL, 0); break;
		case 'm': mtu = atoi(optarg); break;
		case 't': timeout_s = atoi(optarg); break;
		default: usage();
		}
	}
	if (!size || size > (1u << 30) || !mtu_enum(mtu) || timeout_s <= 0)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);

	/* ---- verbs setup */
	int ndev = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev), *dev = NULL;
	for (int i = 0; list && i < ndev; i++)
		if (!strcmp(ibv_get_device_name(list[i]), devname))
			dev = list[i];
	if (!dev) {
		say("no RDMA device %s (%d devices)", devname, ndev);
		return 2;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx) {
		say("ibv_open_device(%s): %s", devname, strerror(errno));
		return 2;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	uint8_t *buf = NULL;
	if (!pd || posix_memalign((void **)&buf, 4096, 2 * size)) {
		say("ibv_alloc_pd or the %zu-byte buffer failed", 2 * size);
		return 2;
	}
	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	uint8_t seed = (uint8_t)(rand() & 0xff);
	memset(buf, 0, size);
	for (size_t k = 0; k < size; k++)
		buf[size + k] = bulk_byte(seed, k);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * size,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!mr || !cq) {
		say("ibv_reg_mr or ibv_create_cq failed: %s", strerror(errno));
		return 2;
	}
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp) {
		say("ibv_create_qp: %s", strerror(errno));
		return 2;
	}
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS)) {
		say("INIT: %s", strerror(errno));
		return 2;
	}
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) {
		say("ibv_query_gid(index %d): %s", gidx, strerror(errno));
		return 2;
	}
	uint32_t psn = (uint32_t)rand() & 0xffffff;

	/* ---- TCP: one client, bounded */
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (inet_pton(AF_INET, listen_ip, &sa.sin_addr) != 1 ||
	    bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) {
		say("listen on %s:%d: %s", listen_ip, port, strerror(errno));
		return 2;
	}
	say("%s QPN 0x%06x PSN 0x%06x, buffer %p: %zu-byte WRITE target, %zu-byte READ source "
	    "(seed 0x%02x), R_Key 0x%x; listening on %s:%d",
	    devname, qp->qp_num, psn, (void *)buf, size, size, seed, mr->rkey, listen_ip, port);
	if (wait_fd(ls, POLLIN)) {
		say("timed out after %d s waiting for a client", timeout_s);
		return 3;
	}
	int s = accept(ls, NULL, NULL);
	if (s < 0) {
		say("accept: %s", strerror(errno));
		return 3;
	}
	close(ls);

	char msg[MSG_LEN + 1] = { 0 }, gidhex[33];
	unsigned lid, rqpn, rpsn;
	if (read_full(s, msg, MSG_LEN, "reading the client's address message"))
		return 3;
	if (msg[MSG_LEN - 1] != 0 || sscanf(msg, "%x:%x:%x:%32s", &lid, &rqpn, &rpsn, gidhex) != 4 ||
	    strlen(gidhex) != 32) {
		say("bad address message from the client: %.52s", msg);
		return 3;
	}
	union ibv_gid rgid;
	for (int i = 0; i < 16; i++) {
		unsigned b;
		if (sscanf(gidhex + 2 * i, "%2x", &b) != 1) {
			say("bad GID in the client's address message: %s", gidhex);
			return 3;
		}
		rgid.raw[i] = (uint8_t)b;
	}
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu_enum(mtu);
	a.dest_qp_num = rqpn & 0xffffff;
	a.rq_psn = rpsn & 0xffffff;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.dlid = (uint16_t)lid;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = rgid;
	a.ah_attr.grh.sgid_index = (uint8_t)gidx;
	a.ah_attr.grh.hop_limit = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					  IBV_QP_MIN_RNR_TIMER)) {
		say("RTR: %s", strerror(errno));
		return 2;
	}
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
		say("RTS: %s", strerror(errno));
		return 2;
	}
	for (int i = 0; i < 16; i++)
		sprintf(gidhex + 2 * i, "%02x", gid.raw[i]);
	memset(msg, 0, sizeof msg);
	snprintf(msg, sizeof msg, "%04x:%06x:%06x:%s", 0u, qp->qp_num, psn, gidhex);
	if (write_full(s, msg, MSG_LEN, "sending our address message"))
		return 3;
	char done[5];
	if (read_full(s, done, 5, "reading the client's \"done\""))
		return 3;
	if (memcmp(done, "done", 5)) {
		say("bad message from the client: expected \"done\\0\"");
		return 3;
	}
	char line[MAX_LINE];
	snprintf(line, sizeof line,
		 "ibal-qpx/1 mode=rc size=%zu iters=1 seed=%02x write=1 addr=%llx rkey=%x bulk=%zu\n",
		 size, seed, (unsigned long long)(uintptr_t)buf, mr->rkey, size);
	if (write_full(s, line, strlen(line), "sending our extension line"))
		return 3;
	if (read_line(s, line, "reading the client's extension line"))
		return 3;
	const char *fs = field(line, "seed"), *fb = field(line, "bulk");
	if (strncmp(line, "ibal-qpx/1 ", 11) || !fs || !fb || strtoull(fb, NULL, 10) != size) {
		say("the client's extension line does not run --rdma-bulk %zu: %s", size, line);
		return 3;
	}
	uint8_t peer_seed = (uint8_t)strtoul(fs, NULL, 16);
	say("client QPN 0x%06x PSN 0x%06x GID %s seed 0x%02x; waiting for its RDMA WRITE and READ",
	    rqpn, rpsn, gidhex, peer_seed);

	/* The client WRITEs and READs; it says when both completed. */
	if (read_line(s, line, "waiting for the client's bulk-done"))
		return 3;
	if (strncmp(line, "ibal-qpx/1 bulk-done ", 21)) {
		say("bad message from the client: expected bulk-done, got %s", line);
		return 3;
	}
	int read_ok = strstr(line, "read_ok=1") != NULL;
	char why[256], verdict[400];
	int bad = check(buf, size, peer_seed, (size_t)mtu, why, sizeof why);
	if (bad)
		snprintf(verdict, sizeof verdict, "ibal-qpx/1 bulk-verdict FAIL %s", why);
	else
		snprintf(verdict, sizeof verdict, "ibal-qpx/1 bulk-verdict ok checked=%zu", size);
	snprintf(line, sizeof line, "%s\n", verdict);
	int send_err = write_full(s, line, strlen(line), "sending our verdict");
	/* The client's READ copied our second half; it must be untouched. */
	char why2[256];
	int src_bad = check(buf + size, size, seed, (size_t)mtu, why2, sizeof why2);
	printf("rdma_peer: %s WRITE of %zu bytes (%zu packets at MTU %d) %s; client's READ of %zu "
	       "bytes %s%s%s\n",
	       bad || !read_ok || src_bad ? "FAIL" : "PASS", size, (size + mtu - 1) / mtu, mtu,
	       bad ? why : "checked", size, read_ok ? "checked by the client" : "WRONG at the client",
	       src_bad ? "; our READ source changed: " : "", src_bad ? why2 : "");
	/* Let the client read the verdict before the QP goes. */
	if (!send_err && wait_fd(s, POLLIN) == 0)
		(void)read(s, line, 1);
	close(s);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	if (send_err)
		return 3;
	return bad || !read_ok || src_bad ? 1 : 0;
}
