"""The audit database's schema, as numbered migrations applied in order by `relaunch db migrate`
(relaunch/connectors/db_setup.py): each is one transaction, never edited once released; a change
is a new entry at the end."""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        create table incidents (
            id          text primary key,
            cluster     text not null,
            job_id      text not null,
            attempt     integer not null,
            created_at  timestamptz not null default now()
        );
        create table audit_events (
            id           bigserial primary key,
            incident_id  text not null references incidents(id),
            kind         text not null,
            at           timestamptz not null,
            actor        text not null,
            stage        text,
            nodes        text[] not null default '{}',
            summary      text not null default '',
            data         jsonb not null default '{}'::jsonb,
            dedupe_key   text unique
        );
        create index audit_events_incident on audit_events (incident_id, id);
        create index audit_events_nodes on audit_events using gin (nodes);
        create index audit_events_kind_at on audit_events (kind, at);
        create index incidents_job on incidents (cluster, job_id);
        create function audit_events_append_only() returns trigger language plpgsql as $$
        begin
            raise exception 'the audit trail is append-only';
        end $$;
        create trigger audit_events_append_only before update or delete on audit_events
            for each row execute function audit_events_append_only();
        """,
    ),
    (
        2,
        # The console's read side: newest incidents, audit search by actor, open incidents (an
        # anti-join against the small set of terminal stage rows), incidents by category.
        """
        create index incidents_created_at on incidents (created_at desc);
        create index audit_events_actor on audit_events (actor, id);
        create index audit_events_terminal on audit_events (incident_id)
            where kind = 'stage'
            and stage in ('done', 'held', 'no_action', 'rejected', 'expired', 'failed');
        create index audit_events_verdict_category on audit_events
            ((data->>'category'), incident_id) where kind = 'verdict';
        """,
    ),
    (
        3,
        # Pushed-in signals are recorded under one placeholder incident per cluster (every audit
        # row belongs to an incident); lists of recoveries read this view and leave it out.
        """
        create view recoveries as select * from incidents where id not like 'intake-%';
        """,
    ),
    (
        4,
        # A cluster's audited mode changes (promotions, demotions) are recorded under one
        # placeholder incident, `rollout-<cluster>`: not a recovery either. Plans are what the
        # scorecard reads, by time.
        """
        create or replace view recoveries as select * from incidents
            where id not like 'intake-%' and id not like 'rollout-%';
        create index audit_events_plan_at on audit_events (at) where kind = 'plan';
        """,
    ),
    (
        5,
        # A cluster's pauses and unpauses (the kill switch) are recorded under one placeholder
        # incident, `control-<cluster>`: not a recovery either.
        """
        create or replace view recoveries as select * from incidents
            where id not like 'intake-%' and id not like 'rollout-%'
            and id not like 'control-%';
        """,
    ),
]
