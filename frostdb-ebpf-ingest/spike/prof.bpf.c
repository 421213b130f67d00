// SPDX-License-Identifier: GPL-2.0
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#ifndef STACK_DEPTH
#define STACK_DEPTH 127
#endif
#ifndef KFLAGS
#define KFLAGS 0
#endif

struct key_t { __u32 pid; __s32 user_stack_id; __s32 kernel_stack_id; __u32 kmode; };

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16384);
  __type(key, struct key_t); __type(value, __u64); } counts SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_STACK_TRACE); __uint(max_entries, 16384);
  __uint(key_size, sizeof(__u32)); __uint(value_size, STACK_DEPTH * sizeof(__u64)); } stacks SEC(".maps");
// errs[(kind*2+kmode)*64 + min(-ret,63)], kind 0 = kernel, 1 = user; errno 0 slot = success
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 256);
  __type(key, __u32); __type(value, __u64); } errs SEC(".maps");
// bpf_get_stack variant
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 1);
  __type(key, __u32); __type(value, __u64[127]); } stkbuf SEC(".maps");
// gs[kmode*2 + ok]
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 4);
  __type(key, __u32); __type(value, __u64); } gs SEC(".maps");

static __always_inline void bump(void *map, __u32 idx) {
  __u64 *v = bpf_map_lookup_elem(map, &idx);
  if (v) __sync_fetch_and_add(v, 1);
}

SEC("perf_event")
int do_sample(struct bpf_perf_event_data *ctx) {
  __u32 kmode = (ctx->regs.cs & 3) == 0;
  __u32 pid = bpf_get_current_pid_tgid() >> 32;
  struct key_t key = { .pid = pid, .kmode = kmode };
  long k = bpf_get_stackid(ctx, &stacks, KFLAGS);
  long u = bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK | KFLAGS);
  key.kernel_stack_id = k; key.user_stack_id = u;
  __u32 ke = k < 0 ? (-k > 63 ? 63 : -k) : 0;
  __u32 ue = u < 0 ? (-u > 63 ? 63 : -u) : 0;
  bump(&errs, (0 * 2 + kmode) * 64 + ke);
  bump(&errs, (1 * 2 + kmode) * 64 + ue);
  __u32 z = 0;
  __u64 *buf = bpf_map_lookup_elem(&stkbuf, &z);
  if (buf) {
    long n = bpf_get_stack(ctx, buf, 127 * sizeof(__u64), 0);
    bump(&gs, kmode * 2 + (n > 0));
  }
  __u64 one = 1, *c = bpf_map_lookup_elem(&counts, &key);
  if (c) __sync_fetch_and_add(c, 1);
  else bpf_map_update_elem(&counts, &key, &one, BPF_NOEXIST);
  return 0;
}
char LICENSE[] SEC("license") = "GPL";
