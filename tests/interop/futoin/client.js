'use strict';
// The real FutoIn FTN18 client (futoin-eventstream 1.3.9) driven from tidings' tests and
// benchmark. Usage: node client.js '<json options>'; prints one JSON object per line:
//   {"event": {...}}             an event received (reliable, live, poll)
//   {"seq": N}                   a push group's seq (reliable, live) before its events
//   {"ready": true}              readyToReceive answered (push modes)
//   {"result": ...}              a call's result (gen, call)
//   {"error": "Name", "info": …} an error the client raised
//   {"done": true, "ms": T}      finished (count reached), with the elapsed milliseconds
// Options: mode (reliable | live | poll | gen | call), url, creds, component, want, count
// (stop after this many events), crash_after (reliable: exit without acknowledging the
// group that would take the total past this many events), version (poll: 1.0 or 1.1),
// iface/func/params (call), type/data/count (gen), quiet (print only done/errors).

const $as = require( 'futoin-asyncsteps' );
const { AdvancedCCM } = require( 'futoin-invoker' );
const GenFace = require( 'futoin-eventstream/GenFace' );
const PollFace = require( 'futoin-eventstream/PollFace' );
const ReliableReceiver = require( 'futoin-eventstream/ReliableReceiver' );
const LiveReceiver = require( 'futoin-eventstream/LiveReceiver' );

const opts = JSON.parse( process.argv[2] );
const out = ( obj ) => process.stdout.write( JSON.stringify( obj ) + '\n' );
const started = Date.now();
let received = 0;

function finish()
{
    out( { done: true, ms: Date.now() - started } );
    process.exit( 0 );
}

function fail( as, err )
{
    out( { error: err, info: as.state.error_info || null } );
    process.exit( 3 );
}

function onEvents( events )
{
    if ( opts.crash_after !== undefined && received + events.length > opts.crash_after )
    {
        process.exit( 9 ); // killed before acknowledging this group
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

( { reliable: () => receive( ReliableReceiver ), live: () => receive( LiveReceiver ), poll, gen, call } )[opts.mode]();
