import Bayeux
import Testing

/// Each key of an object was looked for among the keys before it (duplicates: the last wins), so an object of n
/// keys cost n² / 2 comparisons. A 1 MiB request of 100,000 keys held a core for minutes (20,000 keys: 3.5 minutes in a debug build). The 40,000 keys here take about
/// a second in a debug build; quadratic, they would take a quarter of an hour: the time limit is between the two.
@Suite struct JSONParserLargeObjectTests {
    @Test(.timeLimit(.minutes(1))) func anObjectOfManyKeysParsesInLinearTimeAndTheLastDuplicateStillWins() throws {
        var text = "{"
        for i in 0..<40_000 { text += "\"k\(i)\":\(i)," }
        // Duplicates of an early key, a late one, and one in a form that is the same string (é as e + U+0301).
        text += #""k0":"again","k39999":"again","\u00e9":1,"e\u0301":2,"k5":"last"}"#
        let object = try #require(try JSONParser().parse(text).objectValue)
        #expect(object.count == 40_001)
        #expect(object.keys.first == "k0")
        #expect(object["k0"] == "again")
        #expect(object["k5"] == "last")
        #expect(object["k39999"] == "again")
        #expect(object["é"] == 2)
        #expect(object.keys.last == "é")
        #expect(object["k20000"] == 20000)
    }

    @Test func duplicatesInSmallObjectsAndAcrossTheIndexThresholdKeepTheFirstPlaceAndTheLastValue() throws {
        for count in [1, 15, 16, 17, 18, 40] {
            let keys = (0..<count).map { "k\($0)" }
            let first = keys.map { "\"\($0)\":0" }
            let again = keys.reversed().map { "\"\($0)\":1" }
            let object = try #require(try JSONParser().parse("{" + (first + again).joined(separator: ",") + "}").objectValue)
            #expect(object.keys == keys, "\(count)")
            #expect(object.entries.allSatisfy { $0.value == 1 }, "\(count)")
        }
    }
}
