package sql92oracle;

import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import org.apache.rocketmq.broker.filter.MessageEvaluationContext;
import org.apache.rocketmq.filter.FilterFactory;
import org.apache.rocketmq.filter.expression.Expression;

/**
 * The ground truth for rmqstore's SQL92 evaluator (tests/test_filter_oracle.py): RocketMQ 4.4.0's own filter
 * module compiles every expression of a file and evaluates each compiled one on every property map of another,
 * as the broker does (FilterFactory "SQL92", MessageEvaluationContext over the message's String properties).
 *
 *   FilterOracle EXPRS PROPS OUT
 *     EXPRS  one expression a line; PROPS  one message a line, "key=value" items separated by TAB (an empty
 *     line: no properties). Both escaped: backslash escapes for backslash, n, r, t and u followed by 4 hex digits.
 *     OUT    one line per expression: "E<TAB>message" (compile refused: the remark CHECK_CLIENT_CONFIG answers,
 *            escaped) or "C<TAB>toString<TAB>outcomes" with one character per message: T (TRUE), F (FALSE),
 *            N (null), X (an exception: the broker drops the message), O (another value).
 *
 * Build and run against the jars of ../shared/realmq (CI cannot; the outputs are committed):
 *   R=~/.cache/rmqstore-realmq; javac -cp "$($R/run.sh cp)" -d /tmp/oracle FilterOracle.java
 *   java -cp "$($R/run.sh cp):/tmp/oracle" sql92oracle.FilterOracle exprs.txt props.txt out.txt
 */
public class FilterOracle {
    public static void main(String[] a) throws Exception {
        List<String> exprs = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(a[0]), StandardCharsets.UTF_8)) exprs.add(unescape(line));
        List<Map<String, String>> msgs = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(a[1]), StandardCharsets.UTF_8)) {
            Map<String, String> m = new HashMap<>();
            if (!line.isEmpty()) {
                for (String item : line.split("\t", -1)) {
                    int eq = item.indexOf('=');
                    m.put(unescape(item.substring(0, eq)), unescape(item.substring(eq + 1)));
                }
            }
            msgs.add(m);
        }
        StringBuilder out = new StringBuilder();
        for (String e : exprs) {
            Expression x;
            try {
                x = FilterFactory.INSTANCE.get("SQL92").compile(e);
            } catch (Throwable t) {
                out.append("E\t").append(escape(String.valueOf(t.getMessage()))).append('\n');
                continue;
            }
            StringBuilder r = new StringBuilder();
            for (Map<String, String> m : msgs) {
                Object v;
                try {
                    v = x.evaluate(new MessageEvaluationContext(m));
                } catch (Throwable t) {
                    r.append('X');
                    continue;
                }
                r.append(v == null ? 'N' : v == Boolean.TRUE ? 'T' : v == Boolean.FALSE ? 'F' : 'O');
            }
            out.append("C\t").append(escape(x.toString())).append('\t').append(r).append('\n');
        }
        Files.write(Paths.get(a[2]), out.toString().getBytes(StandardCharsets.UTF_8));
        System.out.println("ORACLE " + exprs.size() + " expressions x " + msgs.size() + " messages");
    }

    static String unescape(String s) {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c != '\\' || i + 1 >= s.length()) { b.append(c); continue; }
            char n = s.charAt(++i);
            switch (n) {
                case 'n': b.append('\n'); break;
                case 'r': b.append('\r'); break;
                case 't': b.append('\t'); break;
                case 'u': b.append((char) Integer.parseInt(s.substring(i + 1, i + 5), 16)); i += 4; break;
                default: b.append(n);
            }
        }
        return b.toString();
    }

    static String escape(String s) {
        StringBuilder b = new StringBuilder();
        for (char c : s.toCharArray()) {
            if (c == '\\') b.append("\\\\");
            else if (c == '\n') b.append("\\n");
            else if (c == '\r') b.append("\\r");
            else if (c == '\t') b.append("\\t");
            else if (c < 0x20 || c > 0x7e) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.toString();
    }
}
