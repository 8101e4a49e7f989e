import RelayFakes

#if canImport(Glibc)
    import Glibc
#endif

/// `relay-fake <kind> [options]`: one of the fake feed servers, for the CLI suites.
let fakes: [any StandaloneFake.Type] = [BLIPFake.self, SimperiumFake.self, CouchDBFake.self]

func printError(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard let kind = arguments.first, let fake = fakes.first(where: { $0.name == kind }) else {
    let names = fakes.map { $0.name }.joined(separator: "|")
    printError("usage: relay-fake <\(names)> [options]")
    exit(64)
}
do {
    try await fake.runStandalone(arguments: Array(arguments.dropFirst()))
} catch {
    printError("relay-fake \(kind): \(error)")
    exit(1)
}
