// SPDX-License-Identifier: GPL-2.0
//
// The kernel half of the sampler: runs on every CPU-clock tick of every online CPU,
// keeps the sample if its process passes the filter, and counts
// (pid, thread name, user stack, kernel stack) in one of two buffers. User space flips
// `active` each interval, waits one RCU grace period (membarrier), then drains and clears
// the buffer no program can still be writing: nothing is lost or counted twice.
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#define STACK_DEPTH 127
#define MAX_STACKS 8192
#define MAX_KEYS 16384
#define MAX_PIDS 4096

// Keep these in step with src/probe.rs.
#define FILTER_ALL 0
#define FILTER_PIDS 1
#define FILTER_CGROUP 2

#define T_SAMPLED 0 // + buffer: samples kept in that buffer
#define T_DROPPED 2 // + buffer: samples lost because that buffer's count map was full
#define T_IDLE 4 // samples of the idle task (pid 0), not recorded
#define T_NO_USER_STACK 5 // user stack could not be read (kernel threads have none)
#define T_NO_KERNEL_STACK 6 // in kernel mode, yet no kernel stack
#define T_STACKS_FULL 7 // a stack was not kept: that buffer's stack map was full
#define T_LEN 8

// Stacks are keyed by a 64-bit hash of their content, not kept in a STACK_TRACE map: that
// map's ids are bucket indexes, so two stacks landing in one bucket either lose the second
// (-EEXIST) or, with BPF_F_REUSE_STACKID, silently give the first one's samples the second's
// frames. With a few thousand distinct stacks per interval that is a percent or more of
// them. Here a stack is lost only when the map is full, and then it is counted.
struct stack_t {
	__u64 ips[STACK_DEPTH];
};

struct key_t {
	__u32 pid;
	__u32 pad;
	__u64 user_stack; // hash; 0 = none
	__u64 kernel_stack; // hash; 0 = none
	char comm[16];
};

struct settings_t {
	__u32 filter;
	__u32 cgroup_level;
	__u64 cgroup_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings_t);
} settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} active SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PIDS);
	__type(key, __u32);
	__type(value, __u8);
} pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, T_LEN);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

#define COUNTS(name)                                                                       \
	struct {                                                                           \
		__uint(type, BPF_MAP_TYPE_HASH);                                           \
		__uint(max_entries, MAX_KEYS);                                             \
		__type(key, struct key_t);                                                 \
		__type(value, __u64);                                                      \
	} name SEC(".maps")
#define STACKS(name)                                                                       \
	struct {                                                                           \
		__uint(type, BPF_MAP_TYPE_HASH);                                           \
		__uint(max_entries, MAX_STACKS);                                           \
		__type(key, __u64);                                                        \
		__type(value, struct stack_t);                                             \
	} name SEC(".maps")

// Scratch space for reading a stack (too big for the BPF stack).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_t);
} scratch SEC(".maps");

COUNTS(counts0);
COUNTS(counts1);
STACKS(stacks0);
STACKS(stacks1);

static __always_inline void bump(__u32 index)
{
	__u64 *v = bpf_map_lookup_elem(&totals, &index);
	if (v)
		*v += 1; // per-CPU: no other writer
}

// Reads the stack `flags` asks for into scratch, stores it in `stacks` under the hash of
// its content, and returns the hash (0: no stack).
static __always_inline __u64 stack(struct bpf_perf_event_data *ctx, void *stacks,
				   __u64 flags)
{
	__u32 zero = 0;
	struct stack_t *st = bpf_map_lookup_elem(&scratch, &zero);
	if (!st)
		return 0;
	long bytes = bpf_get_stack(ctx, st->ips, sizeof(st->ips), flags);
	if (bytes <= 0)
		return 0;
	__u32 n = bytes / sizeof(__u64);
	// FNV-1a over the frames; the tail past n is zeroed by the helper.
	__u64 h = 0xcbf29ce484222325ULL;
	for (__u32 i = 0; i < STACK_DEPTH; i++) {
		if (i >= n)
			break;
		h = (h ^ st->ips[i]) * 0x100000001b3ULL;
	}
	if (h == 0)
		h = 1;
	if (!bpf_map_lookup_elem(stacks, &h)) {
		long err = bpf_map_update_elem(stacks, &h, st, BPF_NOEXIST);
		if (err && err != -17 /* EEXIST: another CPU stored it first */) {
			bump(T_STACKS_FULL);
			return 0;
		}
	}
	return h;
}

static __always_inline void record(struct bpf_perf_event_data *ctx, void *counts, void *stacks,
				   __u32 buffer, __u32 pid)
{
	struct key_t key = { .pid = pid };
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
	// A sample that interrupted user mode has no kernel frames (the helper would answer
	// -EFAULT): only ask for a kernel stack when the CPU was in ring 0.
	if ((ctx->regs.cs & 3) == 0) {
		key.kernel_stack = stack(ctx, stacks, 0);
		if (!key.kernel_stack)
			bump(T_NO_KERNEL_STACK);
	}
	key.user_stack = stack(ctx, stacks, BPF_F_USER_STACK);
	if (!key.user_stack)
		bump(T_NO_USER_STACK);

	__u64 *count = bpf_map_lookup_elem(counts, &key);
	if (count) {
		__sync_fetch_and_add(count, 1);
	} else {
		__u64 one = 1;
		long err = bpf_map_update_elem(counts, &key, &one, BPF_NOEXIST);
		if (err == -17 /* EEXIST: another CPU inserted it first */) {
			count = bpf_map_lookup_elem(counts, &key);
			if (!count) {
				bump(T_DROPPED + buffer);
				return;
			}
			__sync_fetch_and_add(count, 1);
		} else if (err) {
			bump(T_DROPPED + buffer);
			return;
		}
	}
	bump(T_SAMPLED + buffer);
}

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	__u32 zero = 0;
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	if (pid == 0) {
		bump(T_IDLE);
		return 0;
	}
	struct settings_t *s = bpf_map_lookup_elem(&settings, &zero);
	if (!s)
		return 0;
	if (s->filter == FILTER_PIDS && !bpf_map_lookup_elem(&pids, &pid))
		return 0;
	if (s->filter == FILTER_CGROUP &&
	    bpf_get_current_ancestor_cgroup_id(s->cgroup_level) != s->cgroup_id)
		return 0;
	__u32 *a = bpf_map_lookup_elem(&active, &zero);
	if (a && *a == 1)
		record(ctx, &counts1, &stacks1, 1, pid);
	else
		record(ctx, &counts0, &stacks0, 0, pid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
