'use strict';
// The real FutoIn FTN18 client (futoin-eventstream 1.3.9) driven from tidings' tests and
// benchmark. Usage: node client.js '<json options>'; prints one JSON object per line:
//   {"event": {...}}             an event received (reliable, live, poll)
//   {"seq": N}                   a push group's seq (reliable, live) before its events
//   {"ready": true}              readyToReceive answered (push modes)
//   {"result": ...}              a call's result (gen, call)
//   {"error": "Name", "info": …} an error the client raised
//   {"done": true, "ms": T}      finished (count reached), with the elapsed milliseconds,
//                                the ms until the first event (first_ms), the CPU ms the
//                                process used since it started running (cpu_ms) and until
//                                the first event (first_cpu_ms), and the monotonic time of
//                                the first event in microseconds (first_us, and start_us
//                                for the start); start_ms is the start in ms since the epoch
//   {"latencies": [...], ...}    latency mode's result (see latency() below)
// Options: mode (reliable | live | poll | gen | call), url, creds, component, want, count
// (stop after this many events), crash_after (reliable: exit without acknowledging the
// group that would take the total past this many events), version (poll: 1.0 or 1.1),
// iface/func/params (call), type/data/count (gen), quiet (print only done/errors),
// idle_ms (poll: wait after an empty poll, default 20), last_id (poll: start after it),
// linger_ms (once done, acknowledge what came and exit after this many ms).
// Mode latency (the benchmark's): consumer (push | poll), gen_url, type, rate (events/s),
// seconds; see latency().

const $as = require( 'futoin-asyncsteps' );
const { AdvancedCCM } = require( 'futoin-invoker' );
const GenFace = require( 'futoin-eventstream/GenFace' );
const PollFace = require( 'futoin-eventstream/PollFace' );
const ReliableReceiver = require( 'futoin-eventstream/ReliableReceiver' );
const LiveReceiver = require( 'futoin-eventstream/LiveReceiver' );

const opts = JSON.parse( process.argv[2] );
const out = ( obj ) => process.stdout.write( JSON.stringify( obj ) + '\n' );
const started = Date.now();
const startedUs = Number( process.hrtime.bigint() / 1000n );
const startedCpu = process.cpuUsage();
let received = 0;
let firstMs = null;
let firstCpuMs = null;
let firstUs = null;

function cpuMs()
{
    const used = process.cpuUsage( startedCpu );
    return ( used.user + used.system ) / 1000;
}

let finished = false;

function finish()
{
    finished = true;
    out( { done: true, ms: Date.now() - started, first_ms: firstMs, cpu_ms: cpuMs(),
        first_cpu_ms: firstCpuMs, first_us: firstUs, start_ms: started, start_us: startedUs } );
    if ( opts.linger_ms )
    {
        // let the reply to the last onEvents go out first (FutoIn's server dies when a
        // consumer leaves with a push unanswered)
        setTimeout( () => process.exit( 0 ), opts.linger_ms );
    }
    else
    {
        process.exit( 0 );
    }
}

function fail( as, err )
{
    out( { error: err, info: as.state.error_info || null } );
    process.exit( 3 );
}

function onEvents( events )
{
    if ( finished )
    {
        return;
    }
    if ( opts.crash_after !== undefined && received + events.length > opts.crash_after )
    {
        process.exit( 9 ); // killed before acknowledging this group
    }
    if ( firstMs === null && events.length )
    {
        firstMs = Date.now() - started;
        firstCpuMs = cpuMs();
        firstUs = Number( process.hrtime.bigint() / 1000n ); // the clock of --cpu-prof
    }
    for ( const e of events )
    {
        received++;
        if ( !opts.quiet )
        {
            out( { event: e } );
        }
    }
    if ( opts.count && received >= opts.count )
    {
        finish();
    }
}

function receive( Receiver )
{
    const ccm = new AdvancedCCM( { limitZone: 'unlimited' } );
    const receiver = new Receiver( ccm );
    receiver._onEvents = ( _as, events ) => onEvents( events );
    receiver.on( 'ready', () => out( { ready: true } ) );
    receiver.on( 'workerError', ( err, info ) => out( { error: String( err ), info: info || null } ) );
    receiver.on( 'receiverError', ( ...args ) => out( { error: 'receiverError', info: String( args[1] ) } ) );
    const options = { want: opts.want || null, limitZone: 'unlimited' };
    if ( opts.component )
    {
        options.component = opts.component;
    }
    receiver.start( opts.url, opts.creds, options );
}

function poll()
{
    const ccm = new AdvancedCCM();
    let last_id = opts.last_id || null;
    $as().add(
        ( as ) =>
        {
            PollFace.register( as, ccm, 'poll', opts.url, opts.creds,
                { version: opts.version || '1.1', limitZone: 'unlimited' } );
            as.add( ( as ) =>
            {
                const face = ccm.iface( 'poll' );
                if ( opts.component !== 'LIVE' )
                {
                    face.registerConsumer( as, opts.component );
                }
                as.loop( ( as ) =>
                {
                    face.pollEvents( as, opts.component, last_id, opts.want || null );
                    as.add( ( as, events ) =>
                    {
                        if ( events.length )
                        {
                            last_id = events[events.length - 1].id;
                            onEvents( events );
                        }
                        else
                        {
                            const timer = setTimeout( () => as.success(), opts.idle_ms || 20 );
                            as.setCancel( () => clearTimeout( timer ) );
                        }
                    } );
                } );
            } );
        },
        fail
    ).execute();
}

function gen()
{
    const ccm = new AdvancedCCM();
    $as().add(
        ( as ) =>
        {
            GenFace.register( as, ccm, 'gen', opts.url, opts.creds, { limitZone: 'unlimited' } );
            as.repeat( opts.count || 1, ( as, i ) =>
            {
                ccm.iface( 'gen' ).addEvent( as, opts.type, opts.data === undefined ? { i } : opts.data );
                as.add( ( as, id ) => out( { result: id } ) );
            } );
            as.add( ( _as ) => finish() );
        },
        fail
    ).execute();
}

function call()
{
    const ccm = new AdvancedCCM();
    $as().add(
        ( as ) =>
        {
            const Face = { gen: GenFace, poll: PollFace }[opts.iface];
            Face.register( as, ccm, 'face', opts.url, opts.creds,
                { version: opts.version || '1.1', limitZone: 'unlimited' } );
            as.add( ( as ) => ccm.iface( 'face' ).call( as, opts.func, opts.params || {} ) );
            as.add( ( as, result ) =>
            {
                out( { result } );
                finish();
            } );
        },
        fail
    ).execute();
}

// Latency mode: generator -> consumer latency in one process, both through the FutoIn client.
// The generator has gen_conns (default 1) connections to gen_url, each with its own CCM, and
// first adds one marker event on each (opening it); the consumer's component acknowledges
// the last marker with a poll (url, version), so the consumer reads no older backlog. Then
// the consumer starts (consumer push: ReliableReceiver on push_url; poll: a PollFace loop on
// url that waits idle_ms after an empty poll) and, once it is ready, the generator calls
// addEvent at `rate` per second for `seconds` (round robin over its connections), each with
// data {t: send time in ms, i}, without waiting for earlier calls; the consumer records
// receive time - t for each i.
// Prints {"latencies": [ms, or null if it never came, by i], "gen_rtt": [addEvent's round
// trip in ms, or null, by i], "sent", "received",
// "gen_errors", "max_lag_ms" (the generator's worst lateness), "cpu_ms"} once every event
// arrived or `seconds` + wait_s (default 15) seconds passed.
const now = () => performance.timeOrigin + performance.now();

function latency()
{
    const total = Math.round( opts.rate * opts.seconds );
    const lat = new Array( total ).fill( null );
    const state = { sent: 0, got: 0, genErrors: 0, maxLag: 0, rtt: new Array( total ).fill( null ) };
    const report = () =>
    {
        // exit once the (large) line is written: process.exit would cut a pipe write short
        process.stdout.write( JSON.stringify( { latencies: lat, gen_rtt: state.rtt, sent: state.sent,
            received: state.got, gen_errors: state.genErrors, max_lag_ms: state.maxLag,
            cpu_ms: cpuMs() } ) + '\n', () => process.exit( 0 ) );
    };
    const onEvent = ( e ) =>
    {
        const d = e.data;
        if ( d && typeof d.t === 'number' && d.i < total && lat[d.i] === null )
        {
            lat[d.i] = now() - d.t;
            if ( ++state.got >= total )
            {
                report();
            }
        }
    };
    const ccm = new AdvancedCCM();
    const gens = [];
    for ( let k = 0; k < ( opts.gen_conns || 1 ); k++ )
    {
        gens.push( new AdvancedCCM() );
    }
    $as().add(
        ( as ) =>
        {
            for ( const gccm of gens )
            {
                GenFace.register( as, gccm, 'gen', opts.gen_url, opts.creds, { limitZone: 'unlimited' } );
            }
            PollFace.register( as, ccm, 'poll', opts.url, opts.creds,
                { version: opts.version || '1.1', limitZone: 'unlimited' } );
            as.repeat( gens.length, ( as, k ) =>
            {
                gens[k].iface( 'gen' ).addEvent( as, opts.type, { marker: true } );
                as.add( ( as, id ) =>
                {
                    as.state.marker = id;
                } );
            } );
            as.add( ( as ) =>
            {
                const marker = as.state.marker;
                const poll = ccm.iface( 'poll' );
                poll.registerConsumer( as, opts.component );
                poll.pollEvents( as, opts.component, marker, null ); // acknowledges the marker
                as.add( ( _as ) =>
                {
                    const faces = gens.map( ( c ) => c.iface( 'gen' ) );
                    const go = () => generate( faces, total, state );
                    setTimeout( report, ( opts.seconds + ( opts.wait_s || 15 ) ) * 1000 );
                    if ( opts.consumer === 'push' )
                    {
                        pushLatency( onEvent, go );
                    }
                    else
                    {
                        pollLatency( poll, marker, onEvent, go );
                    }
                } );
            } );
        },
        fail
    ).execute();
}

function generate( faces, total, state )
{
    const period = 1000 / opts.rate;
    const t0 = now();
    const send = ( i ) => $as().add(
        ( as ) =>
        {
            const t = now();
            faces[i % faces.length].addEvent( as, opts.type, { t, i } );
            as.add( ( _as ) =>
            {
                state.rtt[i] = now() - t;
            } );
        },
        ( as, err ) =>
        {
            if ( ++state.genErrors <= 3 )
            {
                out( { error: err, info: as.state.error_info || null } );
            }
        }
    ).execute();
    const tick = () =>
    {
        const due = Math.min( total, Math.floor( ( now() - t0 ) / period ) + 1 );
        if ( due > state.sent )
        {
            state.maxLag = Math.max( state.maxLag, now() - ( t0 + state.sent * period ) );
        }
        while ( state.sent < due )
        {
            send( state.sent++ );
        }
        if ( state.sent < total )
        {
            setTimeout( tick, 1 );
        }
    };
    tick();
}

function pushLatency( onEvent, go )
{
    const ccm = new AdvancedCCM( { limitZone: 'unlimited' } );
    const receiver = new ReliableReceiver( ccm );
    let going = false;
    receiver._onEvents = ( _as, events ) => events.forEach( onEvent );
    receiver.on( 'ready', () =>
    {
        if ( !going )
        {
            going = true;
            go();
        }
    } );
    receiver.on( 'workerError', ( err, info ) => out( { error: String( err ), info: info || null } ) );
    receiver.start( opts.push_url, opts.creds,
        { component: opts.component, want: null, limitZone: 'unlimited' } );
}

function pollLatency( face, marker, onEvent, go )
{
    let last_id = marker;
    go();
    $as().add(
        ( as ) => as.loop( ( as ) =>
        {
            face.pollEvents( as, opts.component, last_id, null );
            as.add( ( as, events ) =>
            {
                if ( events.length )
                {
                    last_id = events[events.length - 1].id;
                    events.forEach( onEvent );
                }
                else
                {
                    const timer = setTimeout( () => as.success(), opts.idle_ms || 20 );
                    as.setCancel( () => clearTimeout( timer ) );
                }
            } );
        } ),
        fail
    ).execute();
}

( { reliable: () => receive( ReliableReceiver ), live: () => receive( LiveReceiver ), poll, gen, call, latency } )[opts.mode]();
