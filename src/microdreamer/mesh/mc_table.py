"""The triangulation table of the torch marching cubes, derived from scikit-image's classic method.

Conventions (ours, not scikit-image's numbering):

- Corner ``n`` (0..7) of the cube with lowest sample ``[i, j, k]`` is the sample
  ``[i + (n >> 2 & 1), j + (n >> 1 & 1), k + (n & 1)]``; the cube's case is
  ``sum(inside(corner n) << n)``.
- Edge ``e = 4 * a + 2 * o1 + o2`` (0..11) runs along axis ``a`` from the corner whose offset is 0 on
  axis ``a`` and ``o1``, ``o2`` on the two other axes (in increasing axis order).
- :data:`TABLE_TEXT` holds, per case 0..255 in order, a whitespace-separated token: the case's
  triangles as three hexadecimal edge digits each (``"-"``: none), wound outward (the normal
  ``cross(v1 - v0, v2 - v0)`` points away from the inside corners).

The table was produced by :func:`derive_table`, which runs ``skimage.measure.marching_cubes(...,
method="lorensen")`` on the 2x2x2 grid of each case and reads back which edges its triangles use and
in which order (then turns each triangle outward). ``tests/test_marching_torch.py`` derives it again
and compares. It is therefore the triangulation scikit-image's Lorensen method uses: the same
triangles in the same order within each cube.
"""

from __future__ import annotations

import functools

import numpy as np

TABLE_TEXT = """
-               480             185             450510          942             982802
851294          952251210       359             480359          319189          490093031
543423          583380302       841142123       310230          0a6             8a4a64
18560a          1a55a6564       60a942          62aa29a98       51860a294       2a621a912519
35960a          64aa48359       31991860a       193691496a61    543342a60       35225aa58a62
0a6218312428    2a61a2312       a17             a17480          a87857          a07704745
a17294          9822807a1       a87785294       7950972907a0    359a17          0483597a1
37997a9a8       793749a4704a    234435a17       7a1580503302    87a278372428    07a370230
016176          814417476       086685657       457647          761160942       617916819296
294085056657    529625765       016617935       935817874476    908709607937    793497647
017607435234    876178862358823 823428837608876 723762          26b             048b26
185b26          105504b26       4696b9          06886b8b9       b96694185       95bb50051b06
9356b2          3590486b2       8911936b2       6b2493430031    b36635654       b36356650058
6843861836b3    36b063103       ab0b20          24bb48b8a       20bb0a518       b1a41b514b24
40990a9ab       98a9ab          851a94b9a0a4    a5195ab9a       ab00b2593       35924828bb8a
0a22ab189193    43193441ab244ab 40550bb0a5b3    835b38ab8       4ab0a44b3184431 a31ab3
7a126b          4807a1b26       57887a26b       b26a04a47745    46996b17a       a17b8098b6b0
94bb4685787a    0b96b00957a0057 a1793526b       6b23594807a1    26b37a3a99a8    04aa47749937b26
a17b35b56654    35bb56658806a17 3a87a33846b3346 36b06337a3a0    7b11b2120       24b48bb87781
08228778527b    4b27b4574       17007997b940    b1781b98b       05785007b9400b9 b57b95
359217012b27    48228bb8117b359 720b27708937789 4b27b4493437    b5435bb4017bb01 835b3881787b
08437b          b37             73b             480b73          518b73          450051b73
29473b          02882973b       185294b73       b73951912210    75b59b          75bb59048
71bb18b89       071970b79049    2b44b7475       280782587b72    b42b8478b187    1b72b1021
b730a6          8a44a63b7       851b7360a       73b651456a61    942a6073b       b739a68a9296
1850a6294b73    51991221aa62b73 9b55b70a6       759b79a4864a    60a71878bb89    164a61149b7119b
60a742547b72    275b72258a6228a 18778bb8442b60a 1b72b11a6162    13a3ba          ba33a1480
53883b8ba       504b05a0b3b5    13aa3b429       9802903a1ba3    942b85a8b3b5    5ba3b55a0295502
15aa59a9b       04815919aa9b    a89ba9          904a09ba9       a1bb1441542b    50280552ba155ba
b4284ba8b       0ba02b          b63360301       4866833813b6    63b653056850    63b536456
29403b13060b    6982966813b6613 8500566533b6294 52962553b5b6    b5905b15060b    19b5911b6481164
860b689b8       9649b6          b0160bb1542bb54 58162b          860b6884282b    b62
327267          327726804       672273851       736632510504    397794746       809907706739
518473674943    910519906739967 925526567       480659756269    716619918692    967269971049910
754746          680586756       418714674       610671          a70073032       a78872273824
18530a20373a    a3273aa2451aa45 39794774aa40    973a798a9       9433477400a7185 973a7995191a
5977900920a7    28a4822a7592275 7891877920a7720 71a492          70a407547       78a758
70a407718784    71a             6a22a1213       4806a1612213    253a5285a26a    a4504aa5326aa32
39119669416a    613a16639806698 34694336a8533a8 953a06          6a2a12219915    a16612215592480
a2692a89a       a2692aa04a49    5a16a5465       5a16a5580506    4a846a          6a0
013032          148241321       385083203       345324          094390130       913981
094390085053    953             259152012       148241159192    289208          249
054015          581             084             -
"""


def corner_offsets() -> np.ndarray:
    """[8, 3] int64: the offset of each cube corner from the cube's lowest sample."""
    n = np.arange(8)
    return np.stack([n >> 2 & 1, n >> 1 & 1, n & 1], axis=1).astype(np.int64)


def edge_geometry() -> tuple[np.ndarray, np.ndarray]:
    """(``[12, 3]`` int64 offset of each edge's lower sample from the cube's lowest sample, ``[12]``
    int64 axis of each edge)."""
    lower = np.zeros((12, 3), np.int64)
    axis = np.zeros(12, np.int64)
    for e in range(12):
        a, o1, o2 = e // 4, (e >> 1) & 1, e & 1
        others = [b for b in range(3) if b != a]
        lower[e, others[0]], lower[e, others[1]] = o1, o2
        axis[e] = a
    return lower, axis


def parse_table(text: str = TABLE_TEXT) -> list[list[tuple[int, int, int]]]:
    """The 256 cases' triangles (edge triples) from the text form of :data:`TABLE_TEXT`."""
    tokens = text.split()
    if len(tokens) != 256:
        raise ValueError(f"a marching-cubes table needs 256 cases, got {len(tokens)}")
    cases = []
    for token in tokens:
        digits = [] if token == "-" else [int(c, 16) for c in token]
        if len(digits) % 3 or any(d > 11 for d in digits):
            raise ValueError(f"bad marching-cubes table entry {token!r}")
        cases.append([tuple(digits[t : t + 3]) for t in range(0, len(digits), 3)])
    return cases


def format_table(cases: list[list[tuple[int, int, int]]]) -> str:
    """The text form (as :data:`TABLE_TEXT`) of 256 cases' triangles, six cases a line."""
    tokens = ["".join(f"{a:x}{b:x}{c:x}" for a, b, c in tris) or "-" for tris in cases]
    rows = [" ".join(t.ljust(15) for t in tokens[r : r + 6]).rstrip() for r in range(0, 256, 6)]
    return "\n" + "\n".join(rows) + "\n"


def derive_table() -> list[list[tuple[int, int, int]]]:
    """The triangles of every case as scikit-image's ``method="lorensen"`` emits them (needs
    scikit-image): the case's corners set to 1 (others 0) on a 2x2x2 grid, marched at level 0.5, so
    every vertex is an edge midpoint that names its edge; faces reversed to point outward (as
    :func:`~microdreamer.mesh.marching.marching_cubes` turns scikit-image's faces)."""
    from skimage import measure

    corners = corner_offsets()
    cases: list[list[tuple[int, int, int]]] = []
    for case in range(256):
        if case in (0, 255):
            cases.append([])
            continue
        volume = np.zeros((2, 2, 2), np.float32)
        for n in range(8):
            if case >> n & 1:
                volume[tuple(corners[n])] = 1.0
        verts, faces, _, _ = measure.marching_cubes(volume, 0.5, method="lorensen")
        edges = []
        for p in verts:
            half = np.flatnonzero(p == 0.5)
            if half.size != 1:
                raise RuntimeError(f"case {case}: vertex {p} is not an edge midpoint")
            a = int(half[0])
            o1, o2 = (int(round(float(p[b]))) for b in range(3) if b != a)
            edges.append(4 * a + 2 * o1 + o2)
        cases.append([(edges[f[0]], edges[f[2]], edges[f[1]]) for f in faces])
    return cases


@functools.cache
def table_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(``[256]`` int64 triangle count per case, ``[256, 5, 3]`` int64 edges of each triangle, 0
    past the count)."""
    cases = parse_table()
    counts = np.array([len(t) for t in cases], np.int64)
    edges = np.zeros((256, max(1, int(counts.max())), 3), np.int64)
    for c, tris in enumerate(cases):
        if tris:
            edges[c, : len(tris)] = np.asarray(tris, np.int64)
    return counts, edges
