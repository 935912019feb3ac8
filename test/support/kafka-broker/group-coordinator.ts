import { randomUUID } from 'node:crypto';

/** Kafka error codes the coordinator answers with. */
export const E = {
  NONE: 0,
  ILLEGAL_GENERATION: 22,
  UNKNOWN_MEMBER_ID: 25,
  REBALANCE_IN_PROGRESS: 27,
} as const;

interface Member {
  id: string;
  protocols: { name: string; metadata: Buffer }[];
  sessionTimeoutMs: number;
  /** How long a rebalance waits for this member to rejoin (JoinGroup v1; the session timeout in v0). */
  rebalanceTimeoutMs: number;
  /** It was given an assignment in a generation: a rebalance waits for it to rejoin. */
  established: boolean;
  lastSeen: number;
  assignment: Buffer;
}

export interface JoinResult {
  error: number;
  generationId: number;
  protocol: string;
  leaderId: string;
  memberId: string;
  members: { id: string; metadata: Buffer }[];
}

/**
 * One consumer group, the classic (eager) protocol: every JoinGroup opens a rebalance that
 * completes when all known members have rejoined. As a Kafka broker does, it waits for the
 * members of the current generation up to their rebalance timeout (a member whose session expires
 * meanwhile is dropped), so no two members consume a partition at once; a group with no such
 * member completes after a short join window that lets members starting together join together.
 * The leader's SyncGroup hands out assignments; heartbeats say REBALANCE_IN_PROGRESS while one runs.
 */
export class Group {
  private members = new Map<string, Member>();
  private generation = 0;
  private leader = '';
  private protocol = '';
  private joining: Map<string, (r: JoinResult) => void> | null = null;
  private joinTimer: NodeJS.Timeout | null = null;
  private syncing: Map<string, (assignment: Buffer, error: number) => void> = new Map();
  private synced = true;
  readonly offsets = new Map<string, bigint>();

  constructor(private readonly joinWindowMs = 300) {}

  join(
    memberId: string,
    clientId: string,
    sessionTimeoutMs: number,
    protocols: { name: string; metadata: Buffer }[],
    rebalanceTimeoutMs = sessionTimeoutMs,
  ): Promise<JoinResult> {
    const id = memberId || `${clientId}-${randomUUID()}`;
    const existing = this.members.get(id);
    this.members.set(id, {
      id,
      protocols,
      sessionTimeoutMs,
      rebalanceTimeoutMs,
      established: existing?.established ?? false,
      lastSeen: Date.now(),
      assignment: existing?.assignment ?? Buffer.alloc(0),
    });
    this.synced = false;
    for (const [, respond] of this.syncing) respond(Buffer.alloc(0), E.REBALANCE_IN_PROGRESS);
    this.syncing.clear();
    return new Promise<JoinResult>((resolve) => {
      this.joining ??= new Map();
      this.joining.set(id, resolve);
      if (this.allJoined()) this.completeJoin();
      else if (!this.joinTimer) {
        const established = [...this.members.values()].filter((m) => m.established);
        const waitMs = established.length > 0 ? Math.max(...established.map((m) => m.rebalanceTimeoutMs)) : this.joinWindowMs;
        this.joinTimer = setTimeout(() => this.completeJoin(), waitMs);
        this.joinTimer.unref();
      }
    });
  }

  private allJoined(): boolean {
    return this.joining !== null && [...this.members.keys()].every((m) => this.joining!.has(m));
  }

  private completeJoin(): void {
    if (this.joinTimer) clearTimeout(this.joinTimer);
    this.joinTimer = null;
    const joined = this.joining;
    this.joining = null;
    if (!joined) return;
    for (const id of [...this.members.keys()]) if (!joined.has(id)) this.members.delete(id);
    for (const m of this.members.values()) m.established = true;
    this.generation++;
    const ids = [...joined.keys()];
    this.leader = ids[0];
    this.protocol = this.members.get(this.leader)!.protocols[0]?.name ?? '';
    for (const [id, resolve] of joined) {
      resolve({
        error: E.NONE,
        generationId: this.generation,
        protocol: this.protocol,
        leaderId: this.leader,
        memberId: id,
        members:
          id === this.leader
            ? ids.map((m) => ({ id: m, metadata: this.members.get(m)!.protocols.find((p) => p.name === this.protocol)?.metadata ?? Buffer.alloc(0) }))
            : [],
      });
    }
  }

  sync(memberId: string, generationId: number, assignments: { memberId: string; assignment: Buffer }[]): Promise<{ error: number; assignment: Buffer }> {
    const member = this.members.get(memberId);
    if (!member) return Promise.resolve({ error: E.UNKNOWN_MEMBER_ID, assignment: Buffer.alloc(0) });
    if (generationId !== this.generation) return Promise.resolve({ error: E.ILLEGAL_GENERATION, assignment: Buffer.alloc(0) });
    member.lastSeen = Date.now();
    if (memberId === this.leader) {
      for (const a of assignments) {
        const m = this.members.get(a.memberId);
        if (m) m.assignment = a.assignment;
      }
      this.synced = true;
      for (const [id, respond] of this.syncing) respond(this.members.get(id)?.assignment ?? Buffer.alloc(0), E.NONE);
      this.syncing.clear();
      return Promise.resolve({ error: E.NONE, assignment: member.assignment });
    }
    if (this.synced) return Promise.resolve({ error: E.NONE, assignment: member.assignment });
    return new Promise((resolve) => this.syncing.set(memberId, (assignment, error) => resolve({ error, assignment })));
  }

  heartbeat(memberId: string, generationId: number): number {
    const member = this.members.get(memberId);
    if (!member) return E.UNKNOWN_MEMBER_ID;
    member.lastSeen = Date.now();
    if (this.joining || !this.synced) return E.REBALANCE_IN_PROGRESS;
    if (generationId !== this.generation) return E.ILLEGAL_GENERATION;
    return E.NONE;
  }

  leave(memberId: string): number {
    if (!this.members.delete(memberId)) return E.UNKNOWN_MEMBER_ID;
    if (this.members.size > 0) this.synced = false;
    if (this.allJoined()) this.completeJoin();
    return E.NONE;
  }

  /**
   * Removes members whose session expired; the rest will rebalance on their next heartbeat, and
   * a rebalance that waited only for them completes.
   */
  expire(now: number): void {
    for (const [id, m] of this.members) {
      if (now - m.lastSeen > m.sessionTimeoutMs && !this.joining?.has(id)) {
        this.members.delete(id);
        this.synced = false;
      }
    }
    if (this.allJoined()) this.completeJoin();
  }
}
