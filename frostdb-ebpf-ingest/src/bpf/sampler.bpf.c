// SPDX-License-Identifier: GPL-2.0
//
// The kernel half of the sampler: runs on every CPU-clock tick of every online CPU,
// keeps the sample if its process passes the filter, and counts
// (pid, thread name, user stack, kernel stack) in one of two buffers. User space flips
// `active` each interval, waits one RCU grace period (membarrier), then drains and clears
// the buffer no program can still be writing: nothing is lost or counted twice.
//
// User stacks of processes whose unwind tables user space has loaded (src/unwind/) are
// walked here from the tables compiled out of each binary's .eh_frame, the same steps as
// src/unwind/walk.rs; other processes' by frame pointer (bpf_get_stack).
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

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
#define T_FRAME_POINTERS 8 // user stack walked by frame pointer: the process has no tables (yet)
#define T_UNWOUND 9 // + END_*: user stacks unwound with tables, by how the walk ended
#define T_LEN (T_UNWOUND + END_LEN)

// How a table walk ended; keep in step with src/probe.rs (UserEnd).
#define END_COMPLETE 0 // at the outermost frame
#define END_NOT_MAPPED 1 // an address in no file mapping (JIT code, the vDSO)
#define END_UNSUPPORTED 2 // CFI the tables do not follow
#define END_NO_CFI 3 // no row and no usable frame pointer
#define END_UNREADABLE 4 // stack memory could not be read
#define END_TOO_DEEP 5 // STACK_DEPTH frames
#define END_LEN 6

#define ROWS_PER_CHUNK 256
#define MAX_MAPPINGS 256

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
	__u32 user_end; // END_* + 1 for a table walk, 0 for a frame-pointer walk
	__u64 user_stack; // hash; 0 = none
	__u64 kernel_stack; // hash; 0 = none
	char comm[16];
};

struct settings_t {
	__u32 filter;
	__u32 cgroup_level;
	__u64 cgroup_id;
	// Random, set at load: where stack hashes start, so that no process can work out a
	// stack of its own that hashes as another process's does (the first stack stored
	// under a hash is what every later one of that hash reads as).
	__u64 hash_seed;
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

// Unwind tables, written by src/unwind/maps.rs. One row per address range of a file:
// from `pc` (the file's virtual address) to the next row's, the CFA is `cfa_kind`
// (0 none, 1 rsp + cfa_offset, 2 rbp + cfa_offset, 3 PLT, 4 signal trampoline,
// 5 unsupported, 6 outermost) and the caller's rbp `rbp_kind` (0 unchanged, 1 saved at
// CFA + rbp_offset, 2 unknown). UnwindRow::encode writes this layout.
struct row_t {
	__u64 pc;
	__s32 cfa_offset;
	__s16 rbp_offset;
	__u8 cfa_kind;
	__u8 rbp_kind;
};

// Rows are stored 256 to an element (one update per 4 KiB, not per row). A file's rows are
// consecutive, from a chunk boundary; user space sets the number of chunks at load.
struct chunk_t {
	struct row_t rows[ROWS_PER_CHUNK];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct chunk_t);
} unwind_rows SEC(".maps");

// An executable file mapping of a process: addresses start..end are the file's virtual
// addresses + bias; its rows are first_row..first_row + rows (0 rows: no table).
struct mapping_t {
	__u64 start;
	__u64 end;
	__u64 bias;
	__u32 first_row;
	__u32 rows;
};

// The fields of the kernel's task_struct read here, at their offsets in the running
// kernel's BTF (CO-RE: the loader relocates each access).
struct task_struct {
	struct task_struct *group_leader;
	__u64 start_boottime; // ns after boot, suspend included: /proc/<pid>/stat field 22
} __attribute__((preserve_access_index));

// A process's tables hold for the process that started at `started` (clock ticks of
// `tick_ns` after boot, as /proc/<pid>/stat has it), not for another one given its pid.
struct process_t {
	__u32 count;
	__u32 tick_ns;
	__u64 started;
	struct mapping_t mappings[MAX_MAPPINGS]; // sorted by start
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PIDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct process_t);
} unwind_processes SEC(".maps");

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

// Stores the first n frames of scratch stack `st` in `stacks` under the hash of their
// content and returns the hash (0: not stored). The slots past n must be zero.
static __always_inline __u64 store(struct stack_t *st, __u32 n, void *stacks)
{
	// FNV-1a over the frames, from a secret start.
	__u32 zero = 0;
	struct settings_t *s = bpf_map_lookup_elem(&settings, &zero);
	__u64 h = 0xcbf29ce484222325ULL ^ (s ? s->hash_seed : 0);
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

static __always_inline struct stack_t *scratch_stack(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&scratch, &zero);
}

// Reads the stack `flags` asks for (a frame-pointer walk) and stores it; returns its hash
// (0: no stack).
static __always_inline __u64 stack(struct bpf_perf_event_data *ctx, void *stacks,
				   __u64 flags)
{
	struct stack_t *st = scratch_stack();
	if (!st)
		return 0;
	long bytes = bpf_get_stack(ctx, st->ips, sizeof(st->ips), flags);
	if (bytes <= 0)
		return 0;
	// The helper zeroes the tail past the stack.
	return store(st, bytes / sizeof(__u64), stacks);
}

// The state of a table walk. It lives in a per-CPU map, not on the stack: values read
// from map memory are unknown to the verifier, so it checks the loop bodies once rather
// than once per constant an index could take (binary searches over precise constants
// branch into millions of states).
struct walk_t {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 pid;
	__u32 n; // frames written
	__u32 end; // END_*, valid once `done`
	__u32 exact; // ip is an interrupted instruction, not a return address
	__u32 done;
	__u32 lo; // binary search bounds
	__u32 hi;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct walk_t);
} walks SEC(".maps");

#define LOAD(x) (*(volatile typeof(x) *)&(x))

static __always_inline __u64 read_user(__u64 at, int *ok)
{
	__u64 v = 0;
	*ok = bpf_probe_read_user(&v, sizeof(v), (void *)at) == 0;
	return v;
}

static __always_inline struct row_t *row_at(__u32 index)
{
	__u32 chunk = index / ROWS_PER_CHUNK;
	struct chunk_t *c = bpf_map_lookup_elem(&unwind_rows, &chunk);
	if (!c)
		return 0;
	return &c->rows[index & (ROWS_PER_CHUNK - 1)];
}

static __always_inline long finish(struct walk_t *w, __u32 end)
{
	w->end = end;
	w->done = 1;
	return 1; // stops bpf_loop
}

// One frame of the walk: src/unwind/walk.rs, ProcessTables::unwind.
static long step(__u64 index, void *unused)
{
	__u32 zero = 0;
	struct walk_t *w = bpf_map_lookup_elem(&walks, &zero);
	struct stack_t *st = scratch_stack();
	if (!w || !st)
		return 1;
	__u32 n = LOAD(w->n);
	if (n >= STACK_DEPTH)
		return finish(w, END_TOO_DEEP);
	__u64 ip = w->ip;
	st->ips[n] = ip;
	w->n = n + 1;
	// A return address points after its call; its row is the call's.
	__u64 pc = w->exact ? ip : ip - 1;
	w->exact = 0;

	struct process_t *p = bpf_map_lookup_elem(&unwind_processes, &w->pid);
	if (!p)
		return finish(w, END_NOT_MAPPED);
	// The last mapping starting at or below pc: after the search, lo is one past it.
	w->lo = 0;
	w->hi = p->count;
	for (int i = 0; i < 9; i++) {
		__u32 lo = LOAD(w->lo), hi = LOAD(w->hi);
		if (lo >= hi)
			break;
		__u32 mid = (lo + hi) / 2;
		if (p->mappings[mid & (MAX_MAPPINGS - 1)].start <= pc)
			w->lo = mid + 1;
		else
			w->hi = mid;
	}
	__u32 found = LOAD(w->lo);
	if (found == 0 || found > MAX_MAPPINGS)
		return finish(w, END_NOT_MAPPED);
	struct mapping_t *m = &p->mappings[(found - 1) & (MAX_MAPPINGS - 1)];
	if (pc >= m->end)
		return finish(w, END_NOT_MAPPED);

	// The last row at or below the file address.
	__u64 address = pc - m->bias;
	__u32 first = m->first_row;
	w->lo = 0;
	w->hi = m->rows;
	for (int i = 0; i < 25; i++) {
		__u32 lo = LOAD(w->lo), hi = LOAD(w->hi);
		if (lo >= hi)
			break;
		__u32 mid = (lo + hi) / 2;
		struct row_t *r = row_at(first + mid);
		if (!r)
			return finish(w, END_UNSUPPORTED);
		if (r->pc <= address)
			w->lo = mid + 1;
		else
			w->hi = mid;
	}
	found = LOAD(w->lo);
	struct row_t row = { 0 };
	if (found > 0) {
		struct row_t *r = row_at(first + found - 1);
		if (!r)
			return finish(w, END_UNSUPPORTED);
		row = *r;
	}

	int ok = 0;
	__u64 cfa;
	switch (row.cfa_kind) {
	case 1:
		cfa = w->sp + (__s64)row.cfa_offset;
		break;
	case 2:
		cfa = w->bp + (__s64)row.cfa_offset;
		break;
	case 3:
		cfa = w->sp + 8 + ((ip & 15) >= 11 ? 8 : 0);
		break;
	case 4: {
		// The signal trampoline: the interrupted registers are in the ucontext at rsp,
		// uc_mcontext (at 40) holding r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
		__u64 mc = w->sp + 40;
		int a, b, c;
		__u64 bp = read_user(mc + 8 * 10, &a);
		__u64 sp = read_user(mc + 8 * 15, &b);
		__u64 rip = read_user(mc + 8 * 16, &c);
		if (!a || !b || !c)
			return finish(w, END_UNREADABLE);
		w->bp = bp;
		w->sp = sp;
		w->ip = rip;
		w->exact = 1;
		return 0;
	}
	case 5:
		return finish(w, END_UNSUPPORTED);
	case 6:
		return finish(w, END_COMPLETE);
	default: {
		// No CFI here: the frame pointer, if this code keeps one. A zero rbp there marks
		// the outermost frame (the ABI's convention; _start clears it).
		__u64 bp = w->bp;
		if (bp == 0)
			return finish(w, END_COMPLETE);
		int a, b;
		__u64 caller_bp = read_user(bp, &a);
		__u64 ra = read_user(bp + 8, &b);
		if (!a || !b)
			return finish(w, END_NO_CFI);
		w->sp = bp + 16;
		w->bp = caller_bp;
		w->ip = ra;
		return ra == 0 ? finish(w, END_COMPLETE) : 0;
	}
	}
	__u64 ra = read_user(cfa - 8, &ok);
	if (!ok)
		return finish(w, END_UNREADABLE);
	if (row.rbp_kind == 1) {
		__u64 bp = read_user(cfa + (__s64)row.rbp_offset, &ok);
		if (!ok)
			return finish(w, END_UNREADABLE);
		w->bp = bp;
	} else if (row.rbp_kind == 2) {
		w->bp = 0; // frames above that need it stop on their own
	}
	w->sp = cfa;
	w->ip = ra;
	return ra == 0 ? finish(w, END_COMPLETE) : 0;
}

// Walks the user stack of `pid` with its unwind tables and stores it; returns its hash
// (0: no stack), and how the walk ended in *end.
static __always_inline __u64 unwind(struct bpf_perf_event_data *ctx, void *stacks, __u32 pid,
				    __u32 *end)
{
	__u32 zero = 0;
	struct walk_t *w = bpf_map_lookup_elem(&walks, &zero);
	struct stack_t *st = scratch_stack();
	if (!w || !st)
		return 0;
	__builtin_memset(w, 0, sizeof(*w));
	w->pid = pid;
	w->exact = 1;
	if ((ctx->regs.cs & 3) == 3) {
		w->ip = ctx->regs.rip;
		w->sp = ctx->regs.rsp;
		w->bp = ctx->regs.rbp;
	} else {
		// In the kernel: the user registers saved at kernel entry.
		struct pt_regs regs;
		struct task_struct *task = bpf_get_current_task_btf();
		if (bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(task)))
			return 0;
		w->ip = regs.rip;
		w->sp = regs.rsp;
		w->bp = regs.rbp;
	}
	__builtin_memset(st, 0, sizeof(*st));
	bpf_loop(STACK_DEPTH + 1, step, 0, 0);
	__u32 e = w->done ? w->end : END_TOO_DEEP;
	if (e >= END_LEN)
		e = END_UNSUPPORTED;
	bump(T_UNWOUND + e);
	*end = e;
	__u32 n = w->n;
	if (n == 0)
		return 0;
	return store(st, n, stacks);
}

// When the current process started, in clock ticks of `tick_ns` after boot.
static __always_inline __u64 started(__u32 tick_ns)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 ns = BPF_CORE_READ(task, group_leader, start_boottime);
	return ns / tick_ns;
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
	struct process_t *p = bpf_map_lookup_elem(&unwind_processes, &pid);
	if (p && p->tick_ns && started(p->tick_ns) == p->started) {
		__u32 end = END_UNREADABLE;
		key.user_stack = unwind(ctx, stacks, pid, &end);
		key.user_end = end + 1;
	} else {
		key.user_stack = stack(ctx, stacks, BPF_F_USER_STACK);
		if (key.user_stack)
			bump(T_FRAME_POINTERS);
	}
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

// A process that exec()s drops its mappings at once: until user space loads the new ones
// (at the next refresh), its stacks are walked by frame pointer rather than with the tables
// of a program it no longer runs. One that exits keeps its entry: its mappings hold until it
// is gone, and a later process given its pid has another start time (see record()); the
// refresh after it drops the entry.
SEC("raw_tracepoint/sched_process_exec")
int on_exec(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	if ((__u32)id == pid) // the thread group's leader: the process itself
		bpf_map_delete_elem(&unwind_processes, &pid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
