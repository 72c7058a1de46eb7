# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_lockrun_global_optspecs
    string join \n u/url= tls-ca= replicas= prefix= v/verbose q/quiet c/command= t/ttl= n/no-wait w/wait= x/exclusive s/shared limit= E/conflict-exit-code= label= metrics-file= kill-after= min-hold= max-waiters= supersede preempt h/help V/version
end

function __fish_lockrun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_lockrun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_lockrun_using_subcommand
    set -l cmd (__fish_lockrun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c lockrun -n "__fish_lockrun_needs_command" -s u -l url -d 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l tls-ca -d 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with' -r -F
complete -c lockrun -n "__fish_lockrun_needs_command" -l replicas -d 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l prefix -d 'Key namespace on the server' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s c -l command -d 'Run this string with /bin/sh -c' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s t -l ttl -d 'Lease length, e.g. 500ms, 30s, 2m, "1h 30m"' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s w -l wait -l timeout -d 'Give up after waiting this long for the lock (default: wait forever); DUR may be a bare number of seconds, as flock\'s -w takes it' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l limit -d 'Up to N holders at once (a counting semaphore); each job gets its place 0..N-1 in LOCKRUN_SLOT. Every user of the name must agree on N' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s E -l conflict-exit-code -d 'Exit code when the lock was not acquired: 0 to 255 but 76 (-E 0 skips quietly, as with flock -n -E 0 in a crontab)' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l label -d 'A note shown by `status` and in waiting messages beside host:pid (a pipeline id, a ticket)' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l metrics-file -d 'At the end of every run (skipped, ran, lost, failed) replace PATH, atomically, with Prometheus text for node_exporter\'s textfile collector: end time, acquired, wait and hold seconds, exit code, lease lost, token. A PATH that cannot be written costs one warning, never the job or its exit code' -r -F
complete -c lockrun -n "__fish_lockrun_needs_command" -l kill-after -d 'Grace between SIGTERM and SIGKILL when the job must stop (default: ttl/10)' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l min-hold -d 'Keep the lock held at least DUR after it was granted, also once the job ended, counted on the engine\'s clock: a crontab line on several hosts then runs once per window. A longer job releases at its end' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -l max-waiters -d 'Wait only while fewer than N requests of this name wait; otherwise give up at once with the conflict code (-E). --max-waiters 1 coalesces: the running job plus one queued run' -r
complete -c lockrun -n "__fish_lockrun_needs_command" -s v -l verbose -d 'Timestamped progress on stderr (-vv also shows every renewal)'
complete -c lockrun -n "__fish_lockrun_needs_command" -s q -l quiet -d 'Print only errors'
complete -c lockrun -n "__fish_lockrun_needs_command" -s n -l no-wait -l nonblock -l nb -d 'Give up at once if the lock is held (flock\'s --nonblock and --nb work too)'
complete -c lockrun -n "__fish_lockrun_needs_command" -s x -l exclusive -d 'An exclusive lock, the default (as flock\'s -x and -e)'
complete -c lockrun -n "__fish_lockrun_needs_command" -s s -l shared -d 'A shared (reader) lock, as flock\'s -s: shared holders run together, never beside an exclusive one'
complete -c lockrun -n "__fish_lockrun_needs_command" -l supersede -d 'Replace the waiting requests of this name that asked for --supersede too (newest wins); each replaced one gives up with the conflict code. Holders and other waiters are never touched'
complete -c lockrun -n "__fish_lockrun_needs_command" -l preempt -d 'Ask the holders of this name to stop: each stops its job at its next renewal (TERM, grace, KILL) and exits 76; then wait our turn, so the job starts only once every process of theirs is gone'
complete -c lockrun -n "__fish_lockrun_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_needs_command" -s V -l version -d 'Print version'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "status" -d 'Show whether NAME is held; without NAME (or as `list`), every name'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "list" -d 'Show whether NAME is held; without NAME (or as `list`), every name'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "release" -d 'Break a lock (operators)'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "doctor" -d 'Check an engine before the first incident, read-only'
complete -c lockrun -n "__fish_lockrun_needs_command" -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s u -l url -d 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l tls-ca -d 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l replicas -d 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l prefix -d 'Key namespace on the server' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l json -d 'Print one JSON object (without NAME: an array of them) instead of text'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s v -l verbose -d 'Timestamped progress on stderr (-vv also shows every renewal)'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s q -l quiet -d 'Print only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -s u -l url -d 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l tls-ca -d 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l replicas -d 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l prefix -d 'Key namespace on the server' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l json -d 'Print one JSON object (without NAME: an array of them) instead of text'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -s v -l verbose -d 'Timestamped progress on stderr (-vv also shows every renewal)'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -s q -l quiet -d 'Print only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l token -d 'Break only the holder with token T (default: every holder)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s u -l url -d 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l tls-ca -d 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l replicas -d 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l prefix -d 'Key namespace on the server' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l force -d 'Required: breaking a lock someone holds is deliberate'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l now -d 'Delete the lease at once and wake a waiter. Unsafe without fencing: the old job may still be running when the next one starts'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s v -l verbose -d 'Timestamped progress on stderr (-vv also shows every renewal)'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s q -l quiet -d 'Print only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand doctor" -s u -l url -d 'Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS), redis+sentinel://host[:port][,host...]/MASTER[/db], redis+cluster://host[:port][,host...] (rediss+sentinel://, rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...], etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or postgresql://, PG* variables as libpq reads them), mysql://[user[:pass]@]host[:port]/dbname (or mariadb://), zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://), zks://... (TLS), or file:///dir. Default: a per-user directory on this machine' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand doctor" -l tls-ca -d 'CA certificate file (PEM) to verify a TLS server (rediss://, etcds://, postgres:// with sslmode=require or verify-*, mysql:// with ssl-mode=REQUIRED or VERIFY_*, zks://) with' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand doctor" -l replicas -d 'A grant or renewal counts only once N replicas acknowledged it (engines with replicas: Redis, also behind Sentinel)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand doctor" -l prefix -d 'Key namespace on the server' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand doctor" -s v -l verbose -d 'Timestamped progress on stderr (-vv also shows every renewal)'
complete -c lockrun -n "__fish_lockrun_using_subcommand doctor" -s q -l quiet -d 'Print only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status list release doctor help" -f -a "status" -d 'Show whether NAME is held; without NAME (or as `list`), every name'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status list release doctor help" -f -a "list" -d 'Show whether NAME is held; without NAME (or as `list`), every name'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status list release doctor help" -f -a "release" -d 'Break a lock (operators)'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status list release doctor help" -f -a "doctor" -d 'Check an engine before the first incident, read-only'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from status list release doctor help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
