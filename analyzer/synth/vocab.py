"""The synthetic vocabulary: common English words, each one cl100k token with a leading space.

Text built from these words has a token count known without tokenizing (one per word, one
per punctuation mark), which keeps generation fast; tests/synth/test_synth.py checks the claim
against tiktoken. The order is the popularity rank used for the Zipf word distribution
(function words first).
"""

_TEXT = """
the of and to in is that for it as with was on be by at this are from or an have not which but
they all were can has their more will one also other been when there would about into than its
only some time these first may such new after most two over like use used could between many so
should where through each well any because system data model work people year very under both
same while state part during since without high number make value process order form large small
long case point group set service user request cache memory network storage server client policy
report result table field record query index file line block token prompt output input session
tenant document section page chapter example answer question reason method function class module
package library version release update change issue error warning message event signal source
target level layer node cluster region zone rate limit budget cost price plan team project
product customer account contract market sales revenue growth quarter month week day hour minute
second morning evening history review summary analysis design test build deploy monitor measure
compare improve reduce increase support provide include require create define describe explain
consider follow allow show find keep give take help run start stop read write send receive load
store fetch compute check verify return select filter sort merge split join parse format render
convert encode decode train serve scale route balance schedule queue batch stream buffer window
frame packet channel socket thread worker task job step stage phase cycle loop path graph tree
list array map key pair entry item element object instance type schema column row cell header
footer body title label name address phone email date amount total count average median peak
share ratio fraction percent degree weight height width length size depth speed latency
throughput bandwidth capacity usage demand supply traffic volume pressure temperature energy
power battery engine motor vehicle flight airport station city country river mountain forest
ocean island coast valley garden house room kitchen office school hospital museum theater
factory farm bridge road street tower wall door floor roof chair bed desk lamp book paper letter
story poem song music picture movie game sport player coach match score goal season league club
friend family parent child student teacher doctor nurse lawyer engineer manager director officer
agent partner member leader owner author editor reader writer speaker listener visitor guest
neighbor stranger simple clear quick slow fast early late recent current previous next final
initial main primary secondary basic advanced complex common rare strong weak heavy light bright
dark warm cold hot dry wet soft hard smooth rough clean dirty quiet loud safe dangerous easy
difficult cheap expensive rich poor young old modern ancient public private local global
national international social economic political legal medical technical scientific financial
digital physical natural human personal professional general specific special regular normal
standard typical unusual important useful helpful careful successful available possible
necessary different similar several certain various whole entire single double multiple active
passive direct indirect open closed free busy ready able likely real true false correct wrong
good bad better best worse great little big huge tiny wide narrow deep shallow full empty
usually often always never sometimes rarely already still again once twice almost quite rather
really actually probably certainly clearly simply nearly exactly directly quickly slowly
carefully easily finally recently currently generally especially particularly however therefore
although unless whether perhaps instead otherwise meanwhile moreover indeed above below across
along around behind beyond inside outside toward within upon against among before until
yesterday today tomorrow north south east west left right center middle front back top bottom
side edge corner surface apple orange coffee bread water salt sugar glass metal stone wood
cotton silver gold iron copper plastic rubber
"""
WORDS = tuple(_TEXT.split())

# Words whose capitalised form (" Word") is two tokens instead of one.
CAPITAL_TWO_TOKENS = frozenset(
    [
        "bandwidth",
        "careful",
        "carefully",
        "difficult",
        "directly",
        "expensive",
        "indirect",
        "latency",
        "poem",
        "rarely",
        "shallow",
        "slowly",
        "throughput",
        "toward",
        "unusual",
    ]
)
